"""HTTP calls to a broker's web console (``sparkmq.console``) as a browser would make
them, without following redirects: ``call`` answers ``(status, headers, body)``."""
from __future__ import annotations

import http.client
from urllib.parse import urlencode, urlsplit


def call(base: str, method: str, path: str, *, form: dict | None = None,
         headers: dict | None = None) -> tuple[int, http.client.HTTPMessage, str]:
    """One request to ``base`` (``http://host:port``); ``form`` is sent url-encoded."""
    url = urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    body = None
    headers = dict(headers or {})
    if form is not None:
        body = urlencode(form).encode()
        headers.setdefault("Content-Type", "application/x-www-form-urlencoded")
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read().decode("utf-8", errors="replace")
    finally:
        conn.close()


def login_cookie(base: str, token: str) -> str:
    """The ``name=value`` of the session cookie ``POST /console/login`` sets for ``token``."""
    status, headers, _ = call(base, "POST", "/console/login", form={"token": token},
                              headers={"Origin": base})
    assert status == 303, status
    return headers["Set-Cookie"].split(";", 1)[0]
