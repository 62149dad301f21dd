// gpulease GPU status: this server's profile, cost so far and rate, how long the
// balance lasts, and its GPU's activity and memory (the idle culler's readings), in
// JupyterLab's status bar; clicking it opens a panel with the last hour as a chart.
// Polls {base_url}gpulease/gpu (gpulease.singleuser.gpu_status, which asks the
// gpulease service with the server's own token) every 5 s. Nothing is made up: a
// figure the culler did not read is "no reading" in the bar and a gap in the chart.
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { MainAreaWidget } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

interface IReading {
  activity: number | null;
  memory_used_bytes: number | null;
  memory_total_bytes: number | null;
  source: string;
  why: string;
  at: string;
}

interface IPoint {
  at: string;
  activity: number | null;
  memory_used_bytes: number | null;
}

export interface IGpuStatus {
  server?: string;
  profile?: string | null;
  rate_per_hour?: string | null;
  cost_so_far?: string | null;
  balance?: string;
  runway_s?: number | null;
  runway_by?: string | null;
  account?: string;
  as_of?: string | null;
  reading?: IReading | null;
  history?: IPoint[];
  history_step_s?: number;
  error?: string;
  now?: string;
}

const POLL_MS = 5000;
const HOUR_MS = 3600 * 1000;
// The history is a point a step (GPULeaseHub.gpu_chart_step, 60 s by default): two
// points further apart than a step and a half have a step with no reading between them,
// drawn as a gap.
function gapMs(s: IGpuStatus): number {
  return 1.5 * 1000 * (s.history_step_s ?? 60);
}
const COMMAND = 'gpulease:gpu-panel';
const SVG_NS = 'http://www.w3.org/2000/svg';

function credits(text: string | null | undefined): string {
  const n = Number(text);
  if (text === null || text === undefined || !isFinite(n)) {
    return '?';
  }
  // The service's figures are exact to the µcr (hover shows them); the bar rounds.
  return Math.abs(n) < 1 && n !== 0 ? n.toFixed(4) : n.toFixed(2);
}

function runway(s: number | null | undefined): string {
  if (s === null || s === undefined) {
    return '';
  }
  if (s >= 48 * 3600) {
    return `${Math.floor(s / 86400)} d left`;
  }
  if (s >= 3600) {
    return `${Math.floor(s / 3600)} h left`;
  }
  return `${Math.floor(s / 60)} min left`;
}

function gib(bytes: number): string {
  return (bytes / 2 ** 30).toFixed(1);
}

function memoryText(r: IReading): string {
  if (r.memory_used_bytes === null) {
    return '';
  }
  const total = r.memory_total_bytes === null ? '' : `/${gib(r.memory_total_bytes)}`;
  return `${gib(r.memory_used_bytes)}${total} GiB`;
}

/** The status bar's text and its hover text, from one answer. */
export function describe(s: IGpuStatus): { text: string; title: string } {
  if (s.error) {
    return { text: 'GPU: no reading', title: `gpulease: ${s.error}` };
  }
  const parts: string[] = [];
  const title: string[] = [];
  if (s.profile) {
    parts.push(s.profile);
    parts.push(`${credits(s.cost_so_far)} cr (${credits(s.rate_per_hour)} cr/h)`);
    title.push(`Cost so far ${s.cost_so_far} cr at ${s.rate_per_hour} cr/h, ` +
               `to ${s.as_of ?? 'the last heartbeat'}`);
    const left = runway(s.runway_s);
    if (left) {
      // what runs out first: the account's balance, or your monthly cap on it
      parts.push(s.runway_by === 'cap' ? `${left} (cap)` : left);
      title.push(s.runway_by === 'cap'
        ? `Your monthly cap on ${s.account} runs out first, at today's rates`
        : `The balance of ${s.account} lasts that long at the rates of all its running servers`);
    }
  }
  title.push(`Balance of ${s.account ?? 'your account'}: ${s.balance ?? '?'} cr`);
  const r = s.reading;
  if (!r) {
    parts.push('GPU: no reading');
    title.push('No GPU reading for this server yet: the idle culler has sent none');
  } else {
    const gpu: string[] = [];
    gpu.push(r.activity === null ? 'GPU: no reading' : `GPU ${Math.round(r.activity)}%`);
    const mem = memoryText(r);
    if (mem) {
      gpu.push(mem);
    }
    let text = gpu.join(' · ');
    if (r.source) {
      text += ` (${r.source})`;
    }
    parts.push(text);
    title.push(`GPU read ${r.source ? 'by ' + r.source : ''} at ${r.at}` +
               (r.why ? `; no reading: ${r.why}` : ''));
  }
  title.push('Click for the last hour');
  return { text: parts.join(' · '), title: title.join('\n') };
}

function svg(tag: string, attrs: Record<string, string | number>): SVGElement {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    el.setAttribute(k, String(v));
  }
  return el;
}

/** Runs of consecutive points with a value, split where a value is missing or the
 * readings stopped for a while: each run is one polyline, never bridged with zeros. */
function runs(points: { t: number; v: number | null }[],
              gap: number): { t: number; v: number }[][] {
  const out: { t: number; v: number }[][] = [];
  let run: { t: number; v: number }[] = [];
  let last = -Infinity;
  for (const p of points) {
    if (p.v === null || p.t - last > gap) {
      if (run.length) {
        out.push(run);
      }
      run = [];
    }
    if (p.v !== null) {
      run.push({ t: p.t, v: p.v });
    }
    last = p.t;
  }
  if (run.length) {
    out.push(run);
  }
  return out;
}

/** The last hour of activity (0-100 %) and memory (0 to the card's memory) as SVG. */
export function chart(s: IGpuStatus, nowMs: number): SVGElement {
  const W = 720;
  const H = 240;
  const left = 40;
  const right = 50;
  const top = 10;
  const bottom = 24;
  const root = svg('svg', {
    class: 'gpulease-gpu-chart',
    viewBox: `0 0 ${W} ${H}`,
    width: W,
    height: H,
    role: 'img'
  });
  const x = (t: number) => left + ((t - (nowMs - HOUR_MS)) / HOUR_MS) * (W - left - right);
  const y = (frac: number) => top + (1 - Math.min(1, Math.max(0, frac))) * (H - top - bottom);
  root.appendChild(svg('rect', { x: left, y: top, width: W - left - right,
                                 height: H - top - bottom, fill: 'none',
                                 stroke: 'var(--jp-border-color2, #ccc)' }));
  const label = (text: string, attrs: Record<string, string | number>) => {
    const t = svg('text', { 'font-size': 11, fill: 'var(--jp-ui-font-color1, #333)', ...attrs });
    t.textContent = text;
    root.appendChild(t);
  };
  label('100%', { x: 4, y: top + 10 });
  label('0%', { x: 4, y: H - bottom });
  label('−60 min', { x: left, y: H - 6 });
  label('now', { x: W - right - 20, y: H - 6 });
  const history = s.history ?? [];
  const total = s.reading?.memory_total_bytes ??
    Math.max(0, ...history.map(p => p.memory_used_bytes ?? 0));
  if (total > 0) {
    label(`${gib(total)} GiB`, { x: W - right + 4, y: top + 10 });
    label('0 GiB', { x: W - right + 4, y: H - bottom });
  }
  const series: [string, string, (p: IPoint) => number | null][] = [
    ['gpulease-gpu-activity', 'var(--jp-brand-color1, #1976d2)',
     p => (p.activity === null ? null : p.activity / 100)],
    ['gpulease-gpu-memory', 'var(--jp-warn-color1, #f57c00)',
     p => (p.memory_used_bytes === null || !(total > 0) ? null : p.memory_used_bytes / total)]
  ];
  for (const [cls, colour, value] of series) {
    const points = history.map(p => ({ t: Date.parse(p.at), v: value(p) }));
    for (const run of runs(points, gapMs(s))) {
      if (run.length === 1) {
        root.appendChild(svg('circle', { class: cls, cx: x(run[0].t), cy: y(run[0].v), r: 2,
                                         fill: colour }));
      } else {
        root.appendChild(svg('polyline', {
          class: cls, fill: 'none', stroke: colour, 'stroke-width': 1.5,
          points: run.map(p => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(' ')
        }));
      }
    }
  }
  return root;
}

class GpuPanel extends Widget {
  constructor() {
    super();
    this.addClass('gpulease-gpu-panel');
    this.node.style.padding = '12px';
    this.node.style.overflow = 'auto';
  }

  render(s: IGpuStatus | null, skewMs: number): void {
    const node = this.node;
    node.textContent = '';
    const head = document.createElement('p');
    head.className = 'gpulease-gpu-panel-summary';
    const legend = document.createElement('p');
    legend.className = 'gpulease-gpu-panel-legend';
    node.append(head, legend);
    if (!s) {
      head.textContent = 'Asking gpulease…';
      return;
    }
    head.textContent = describe(s).text;
    const source = s.reading?.source;
    legend.textContent =
      'Last hour: GPU activity (blue, 0–100 %) and memory in use (orange); ' +
      (source ? `read by ${source}` : 'no source has read this GPU') +
      '. Gaps are times with no reading.' +
      (s.reading?.why ? ` No reading: ${s.reading.why}.` : '') +
      (s.error ? ` ${s.error}` : '');
    node.appendChild(chart(s, Date.now() + skewMs));
    if (!(s.history ?? []).length) {
      const none = document.createElement('p');
      none.className = 'gpulease-gpu-panel-empty';
      none.textContent = 'No reading in the last hour.';
      node.appendChild(none);
    }
  }
}

export const gpuStatusPlugin: JupyterFrontEndPlugin<void> = {
  id: 'gpulease-notices:gpu-status',
  description: "Shows this server's GPU and cost in the status bar, and its last hour",
  autoStart: true,
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, statusBar: IStatusBar | null) => {
    if (!statusBar) {
      return; // a front end without a status bar (Notebook 7's pages): nothing to show in
    }
    const settings = ServerConnection.makeSettings();
    const url = URLExt.join(settings.baseUrl, 'gpulease', 'gpu');
    let last: IGpuStatus | null = null;
    let skewMs = 0; // server clock minus browser clock: the chart's "now" is the server's
    let panel: MainAreaWidget<GpuPanel> | null = null;

    const item = new Widget();
    item.addClass('gpulease-gpu-status');
    item.node.textContent = 'GPU: …';
    item.node.style.cursor = 'pointer';
    item.node.style.padding = '0 6px';

    app.commands.addCommand(COMMAND, {
      label: 'GPU and cost, last hour',
      execute: () => {
        if (!panel || panel.isDisposed) {
          panel = new MainAreaWidget({ content: new GpuPanel() });
          panel.id = 'gpulease-gpu-panel';
          panel.title.label = 'GPU, last hour';
          panel.title.closable = true;
        }
        panel.content.render(last, skewMs);
        if (!panel.isAttached) {
          app.shell.add(panel, 'main');
        }
        app.shell.activateById(panel.id);
      }
    });
    item.node.addEventListener('click', () => void app.commands.execute(COMMAND));

    statusBar.registerStatusItem('gpulease-notices:gpu-status', {
      item,
      align: 'left',
      rank: 100
    });

    let busy = false;
    const poll = async () => {
      // a hidden tab need not ask: it asks again when shown
      if (busy || document.hidden) {
        return;
      }
      busy = true;
      try {
        const response = await ServerConnection.makeRequest(url, {}, settings);
        if (response.ok) {
          last = (await response.json()) as IGpuStatus;
          if (last.now) {
            skewMs = Date.parse(last.now) - Date.now();
          }
          const { text, title } = describe(last);
          item.node.textContent = text;
          item.node.title = title;
          if (panel && !panel.isDisposed && panel.isAttached) {
            panel.content.render(last, skewMs);
          }
        }
      } catch (e) {
        console.debug('gpulease gpu status:', e);
      } finally {
        busy = false;
      }
    };

    void app.restored.then(poll);
    window.setInterval(poll, POLL_MS);
    document.addEventListener('visibilitychange', () => void poll());
  }
};
