// gpulease-notices: show this server's gpulease notices (suspend warnings...) as
// JupyterLab notifications. Polls {base_url}gpulease/notices, served by the
// gpulease.singleuser server extension, every 30 s and when the window regains focus.
// The status bar's GPU and cost are gpu.ts's.
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { gpuStatusPlugin } from './gpu';

interface INotice {
  server: string;
  kind: string;
  message: string;
  deadline: string | null;
  created: string | null;
}

const POLL_MS = 30000;
const TICK_MS = 10000;

function timeLeft(deadline: string | null, skewMs: number): string {
  if (!deadline) {
    return '';
  }
  const ms = Date.parse(deadline) - (Date.now() + skewMs);
  if (isNaN(ms)) {
    return '';
  }
  const s = Math.max(0, Math.round(ms / 1000));
  if (s === 0) {
    return ' (any moment now)';
  }
  return s >= 60 ? ` (${Math.ceil(s / 60)} min left)` : ` (${s} s left)`;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpulease-notices:plugin',
  description: 'Shows gpulease notices (suspend warnings) as notifications',
  autoStart: true,
  activate: (app: JupyterFrontEnd) => {
    const settings = ServerConnection.makeSettings();
    const url = URLExt.join(settings.baseUrl, 'gpulease', 'notices');
    const shown = new Map<string, { id: string; notice: INotice; text: string }>();
    const dismissed = new Set<string>();
    let skewMs = 0; // server clock minus browser clock

    const text = (n: INotice) => n.message + timeLeft(n.deadline, skewMs);
    const key = (n: INotice) => `${n.kind}|${n.created}|${n.deadline}`;

    // A notification that goes away while we still hold it was closed by the user.
    Notification.manager.changed.connect((_, change) => {
      if (change.type !== 'removed') {
        return;
      }
      for (const [k, v] of shown) {
        if (v.id === change.notification.id) {
          shown.delete(k);
          dismissed.add(k);
        }
      }
    });

    // Update only when the text changes: an update re-opens a hidden toast.
    const refresh = (held: { id: string; notice: INotice; text: string }) => {
      const t = text(held.notice);
      if (t !== held.text) {
        held.text = t;
        Notification.update({ id: held.id, message: t });
      }
    };

    const render = (notices: INotice[]) => {
      const live = new Set(notices.map(key));
      for (const [k, v] of shown) {
        if (!live.has(k)) {
          shown.delete(k); // cleared on the hub (activity cancels a warning)
          Notification.dismiss(v.id);
        }
      }
      for (const n of notices) {
        const k = key(n);
        const held = shown.get(k);
        if (held) {
          held.notice = n;
          refresh(held);
        } else if (!dismissed.has(k)) {
          const options = { autoClose: false as const };
          const id = n.deadline
            ? Notification.warning(text(n), options)
            : Notification.info(text(n), options);
          shown.set(k, { id, notice: n, text: text(n) });
        }
      }
    };

    let busy = false;
    const poll = async () => {
      if (busy) {
        return;
      }
      busy = true;
      try {
        const response = await ServerConnection.makeRequest(url, {}, settings);
        if (response.ok) {
          const body = await response.json();
          if (body.now) {
            skewMs = Date.parse(body.now) - Date.now();
          }
          render(Array.isArray(body.notices) ? body.notices : []);
        }
      } catch (e) {
        console.debug('gpulease notices:', e);
      } finally {
        busy = false;
      }
    };

    void app.restored.then(poll);
    window.setInterval(poll, POLL_MS);
    window.addEventListener('focus', () => void poll());
    // Keep the time left current between polls.
    window.setInterval(() => {
      shown.forEach(refresh);
    }, TICK_MS);
  }
};

// The notices, and the GPU and cost in the status bar (gpu.ts).
export default [plugin, gpuStatusPlugin];
