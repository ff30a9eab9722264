"""The cluster console: ``sparkmq console --namesrv ADDR [--port P]``, a small local web
server showing a whole cluster on one page, as rocketmq-dashboard's cluster view.

It asks the NameServer(s) for every registered broker, then each broker's admin
endpoint (``adminEndpoint`` of its registration) for ``GET /console/api/summary``
(:mod:`.api`) with the admin token (``--token``, ``SPARKMQ_ADMIN_TOKEN``,
``--token-file``: ``admin_auth.find_token``, as ``sparkmq admin``), all brokers at
once, on every page view. The page (``/console``) shows:

* brokers: cluster, name, id, role, state, epoch, HA lag (bytes), gRPC endpoint, a
  link to the broker's own console, or why it could not be asked;
* topics across brokers: per topic and broker group (masters, brokerId 0), queues,
  max offset per queue, messages retained, messages in/out per second;
* consumer groups: lag summed over the masters, clients online.

Who may look: bound to loopback (the default, 127.0.0.1) anyone on this host, unless
``--require-login``; bound beyond loopback it needs the token, and it refuses to start
without one. Then it answers only to ``Authorization: Bearer <token>`` or to its login
cookie (the per-broker console's: ``broker/admin_guard.py`` checks both, and the
``Origin`` of its POSTs). The pages carry no script (the console's headers and
escaping, :mod:`.html`).

Thread-safety: a request per thread; nothing is shared but the immutable settings.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import sys
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from ..errors import SparkMQError
from ..lifecycle import REQUEST_TIMEOUT_S
from . import html as h

log = logging.getLogger("sparkmq.console.cluster")

NAV = (("Cluster", "/console"),)
BROKER_TIMEOUT_S = 5.0
SUMMARY_PATH = "/console/api/summary"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------- what the page shows
def fetch_summary(url: str, token: str | None, ssl_context=None,
                  timeout_s: float = BROKER_TIMEOUT_S) -> dict:
    """One broker's ``/console/api/summary``; SparkMQError saying why not."""
    from ..admin_auth import auth_headers
    req = urllib.request.Request(url.rstrip("/") + SUMMARY_PATH, headers=auth_headers(token))
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=ssl_context) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        why = "wrong or missing admin token" if e.code == 401 else e.reason
        raise SparkMQError(f"{url} answered {e.code}: {why}") from None
    except (OSError, ValueError) as e:
        raise SparkMQError(f"cannot ask {url}: {e}") from None


def gather(namesrv: str, token: str | None, *, scheme: str = "http", ssl_context=None,
           timeout_s: float = BROKER_TIMEOUT_S) -> list[dict]:
    """Every broker the NameServer(s) know: its registration, plus ``adminUrl`` and
    ``summary`` (or ``error``). SparkMQError if no NameServer answers."""
    from ..namesrv import NameServerClient
    brokers = NameServerClient(namesrv, timeout_s=timeout_s).brokers()
    if brokers is None:
        raise SparkMQError(f"no NameServer of {namesrv} answered")
    brokers = sorted(brokers, key=lambda b: (b.get("cluster") or "", b.get("brokerName") or "",
                                             b.get("brokerId") or 0))

    def ask(b: dict) -> dict:
        out = dict(b)
        if not b.get("adminEndpoint"):
            out["error"] = "registered no admin endpoint"
            return out
        out["adminUrl"] = f"{scheme}://{b['adminEndpoint']}"
        try:
            out["summary"] = fetch_summary(out["adminUrl"], token, ssl_context, timeout_s)
        except SparkMQError as e:
            out["error"] = e.message
        return out
    if not brokers:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(brokers))) as pool:
        return list(pool.map(ask, brokers))


def _offsets_text(offsets: dict) -> str:
    return " ".join(f"{q}:{v}" for q, v in sorted(offsets.items(), key=lambda kv: int(kv[0])))


def cluster_page(brokers: list[dict], namesrv: str) -> h.Markup:
    """The page's content for ``gather``'s answer."""
    rows = []
    for b in brokers:
        s = (b.get("summary") or {}).get("broker") or {}
        link = (h.link("open", b["adminUrl"] + "/console") if b.get("adminUrl") else "")
        rows.append([b.get("cluster"), b.get("brokerName"), b.get("brokerId"),
                     s.get("role", b.get("role")), s.get("state") or h.tag(
                         "span", b.get("error", "unknown"), class_="error"),
                     s.get("epoch", b.get("epoch")),
                     "" if s.get("haLagBytes") is None else s["haLagBytes"],
                     b.get("endpoint"), link])
    broker_table = h.table(["Cluster", "Broker", "Id", "Role", "State", "Epoch",
                            "HA lag (bytes)", "gRPC endpoint", "Console"], rows,
                           numeric=(2, 5, 6), id_="brokers", empty="no broker registered")
    masters = [b for b in brokers if b.get("brokerId") == 0 and b.get("summary")]
    topic_rows, groups = [], {}
    for b in masters:
        for name, t in sorted(b["summary"]["topics"].items()):
            if t.get("kind") == "SYSTEM":
                continue
            topic_rows.append([name, b["brokerName"], t.get("messageType"), t.get("queues"),
                               _offsets_text(t.get("maxOffsets") or {}), t.get("messages"),
                               h.rate_text(t.get("inPerSecond")),
                               h.rate_text(t.get("outPerSecond"))])
        for g, info in b["summary"]["groups"].items():
            acc = groups.setdefault(g, {"brokers": [], "lag": 0, "clients": 0})
            acc["brokers"].append(b["brokerName"])
            acc["lag"] += info.get("lag") or 0
            acc["clients"] += info.get("clients") or 0
    topic_rows.sort(key=lambda r: (r[0], r[1]))
    topic_table = h.table(["Topic", "Broker", "Message type", "Queues",
                           "Max offset per queue (queue:offset)", "Messages", "In msg/s",
                           "Out msg/s"], topic_rows, numeric=(3, 5, 6, 7), id_="topics",
                          empty="no topic on a reachable master")
    group_table = h.table(["Group", "Brokers", "Clients online", "Lag (all brokers)"],
                          [[g, ", ".join(v["brokers"]), v["clients"], v["lag"]]
                           for g, v in sorted(groups.items())], numeric=(2, 3), id_="groups",
                          empty="no consumer group")
    return h.join([
        h.tag("p", f"NameServer {namesrv}: {len(brokers)} broker(s). Topics and groups are "
                   "read from the masters (brokerId 0); rates are per second over the last "
                   "minute of each broker's console samples."),
        h.tag("h2", "Brokers"), broker_table, h.tag("h2", "Topics"), topic_table,
        h.tag("h2", "Consumer groups"), group_table])


# ---------------------------------------------------------------- the server
class ClusterConsole:
    """The server (``port`` 0: any free port). ``require_login`` None: needed when
    bound beyond loopback."""

    def __init__(self, namesrv: str, token: str | None, *, host: str = "127.0.0.1",
                 port: int = 8090, scheme: str = "http", tls_ca: str | None = None,
                 require_login: bool | None = None):
        from ..admin_auth import client_ssl_context
        if require_login is None:
            require_login = not is_loopback(host)
        if require_login and not token:
            raise SparkMQError(f"the cluster console on {host} needs a login: give the admin "
                               "token (--token, --token-file or SPARKMQ_ADMIN_TOKEN), or bind "
                               "to 127.0.0.1")
        self.namesrv, self.token, self.scheme = namesrv, token, scheme
        self.require_login = require_login
        self.ssl_context = client_ssl_context(tls_ca)
        self.server = ThreadingHTTPServer((host, port), _handler(self))
        self.server.daemon_threads = True
        self.host, self.port = host, self.server.server_address[1]
        self.guard = None
        if require_login:
            from ..broker.admin_guard import AdminGuard, own_origins
            self.guard = AdminGuard(token, own_origins("http", host, host, self.port))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> "ClusterConsole":
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                        name="cluster-console")
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "ClusterConsole":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -------------------------------------------------------------- answers
    def answer(self, method: str, target: str, headers, body: bytes):
        from . import Page, redirect, refusal_page
        path = urlsplit(target).path.rstrip("/") or "/"
        if path == "/":
            return redirect("/console")
        if self.guard is not None:
            refusal = self.guard.refusal(method, path, headers)
            if refusal is not None:
                return refusal_page(refusal, target, nav_links=NAV)
        who = "admin" if self.guard is not None else None
        if method == "GET" and path == "/console":
            try:
                brokers = gather(self.namesrv, self.token, scheme=self.scheme,
                                 ssl_context=self.ssl_context)
            except SparkMQError as e:
                return Page(502, h.page("Cluster", "", error=e.message, who=who,
                                        nav_links=NAV))
            return Page(200, h.page("Cluster", cluster_page(brokers, self.namesrv),
                                    active="/console", who=who, nav_links=NAV))
        if path == "/console/login":
            return self._login(method, body)
        if method == "POST" and path == "/console/logout":
            return redirect("/console/login" if self.guard else "/console",
                            (self._cookie("", max_age=0),) if self.guard else ())
        return Page(404, h.page("Not found", "", error=f"no page {path}", nav_links=NAV))

    def _cookie(self, value: str, *, max_age: int | None = None) -> tuple[str, str]:
        name, _ = self.guard.console_cookie()
        parts = [f"{name}={value}", "Path=/console", "HttpOnly", "SameSite=Strict"]
        if max_age is not None:
            parts.append(f"Max-Age={max_age}")
        return "Set-Cookie", "; ".join(parts)

    def _login(self, method: str, body: bytes):
        from . import Page, redirect
        from .pages import login_form, safe_next
        if self.guard is None:
            return redirect("/console")
        form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
        if method == "GET":
            return Page(200, h.page("Log in", login_form(), nav_links=NAV))
        next_path = safe_next(form.get("next", "/console"))
        if not self.guard.token_matches(form.get("token", "")):
            log.warning("cluster console login refused: wrong token")
            return Page(401, h.page("Log in", login_form(next_path),
                                    error="Wrong admin token.", nav_links=NAV))
        return redirect(next_path, (self._cookie(self.guard.console_cookie()[1]),))


def _handler(console: ClusterConsole):
    from . import MAX_FORM_BYTES, too_large

    class Handler(BaseHTTPRequestHandler):
        server_version = "sparkmq-console"
        timeout = REQUEST_TIMEOUT_S     # a stuck client holds no thread for ever

        def log_message(self, fmt, *args):
            log.debug("%s " + fmt, self.address_string(), *args)

        def _send(self, page) -> None:
            data = page.body.encode("utf-8")
            self.send_response(page.status)
            self.send_header("Content-Type", page.ctype)
            self.send_header("Content-Length", str(len(data)))
            for k, v in page.headers:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _serve(self, method: str, body: bytes = b"") -> None:
            try:
                page = console.answer(method, self.path, self.headers, body)
            # the console answers 500 and keeps serving; the failure is logged
            except Exception as e:
                log.exception("cluster console %s %s failed", method, self.path)
                from . import error_page
                page = error_page(500, f"{type(e).__name__}: {e}")
            self._send(page)

        def do_GET(self):
            self._serve("GET")

        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            if n > MAX_FORM_BYTES or n < 0:
                return self._send(too_large())
            self._serve("POST", self.rfile.read(n) if n else b"")

    return Handler


# ---------------------------------------------------------------- sparkmq console
def main(argv=None) -> int:
    """``sparkmq console --namesrv ADDR [--port P] [--host H]``: serve until SIGINT/SIGTERM."""
    from ..admin_auth import find_token
    p = argparse.ArgumentParser(prog="sparkmq console",
                                description="a web console of a whole cluster (local server)")
    p.add_argument("--namesrv", required=True, help="NameServer address(es) host:port[;host:port]")
    p.add_argument("--port", type=int, default=8090, help="port to serve on (default 8090)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; another needs the token)")
    p.add_argument("--token", help="the brokers' admin token (default: SPARKMQ_ADMIN_TOKEN "
                                   "or --token-file)")
    p.add_argument("--token-file", help="file holding the brokers' admin token")
    p.add_argument("--scheme", default="http", choices=["http", "https"],
                   help="scheme of the brokers' admin ports")
    p.add_argument("--tls-ca", help="CA/certificate file to trust for https admin ports")
    p.add_argument("--require-login", action="store_true",
                   help="ask for the token on loopback too")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                                                   "%(message)s")
    token = find_token(token=args.token, token_file=args.token_file)
    try:
        console = ClusterConsole(args.namesrv, token, host=args.host, port=args.port,
                                 scheme=args.scheme, tls_ca=args.tls_ca,
                                 require_login=args.require_login or None)
    except (SparkMQError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if token is None:
        print("warning: no admin token found; the brokers will refuse (pass --token or set "
              "SPARKMQ_ADMIN_TOKEN)", file=sys.stderr)
    print(f"cluster console of {args.namesrv} at {console.url}/console", flush=True)
    from ..lifecycle import StopSignals
    stop = StopSignals()
    console.start()
    try:
        stop.wait()            # SIGINT or SIGTERM: stopped in order
    finally:
        console.stop()
    return 0
