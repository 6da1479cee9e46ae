"""`evald top` against a real metrics server behind a web config: TLS from a private CA, basic
auth, client certificates; the right options get the page, each wrong one a message saying
what to do."""

from __future__ import annotations

import http.server
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tls_support import PASSWORD, USER, Authority, make_ca, server_cert_for, write_web_config

from evald import cli
from evald.cli import build_parser
from evald.http import MetricsServer
from evald.top.client import PASSWORD_ENV, Client, from_args
from evald.webconfig import load_web_config

ONCE = ["--once", "--interval", "0.1"]


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return make_ca(tmp_path_factory.mktemp("ca"))


def _queries(_params: dict[str, list[str]]) -> tuple[int, Any]:
    return 200, {"queries": []}


@pytest.fixture
def secured(ca: Authority, tmp_path: Path) -> Iterator[str]:
    """HOST:PORT of a metrics server with TLS (the test CA) and basic auth for USER/PASSWORD."""
    web = load_web_config(write_web_config(tmp_path / "web.yml", ca))
    with MetricsServer("127.0.0.1:0", web=web, pages={"/queries": _queries}) as server:
        yield f"127.0.0.1:{server.port}"


@pytest.fixture
def password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)


def _top(*argv: str) -> int:
    return cli.main(["top", *argv, *ONCE])


@pytest.mark.usefixtures("password")
def test_the_right_user_password_and_ca_get_the_view(
    secured: str, ca: Authority, capsys: pytest.CaptureFixture[str]
) -> None:
    # HOST:PORT with --ca-file is https
    assert _top(secured, "--user", USER, "--ca-file", str(ca.ca_cert)) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"evald top · {secured} · "), (out, err)
    assert PASSWORD not in out + err


@pytest.mark.usefixtures("password")
def test_queries_send_the_same_credentials(
    secured: str, ca: Authority, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [f"https://{secured}", "--queries", "--user", USER, "--ca-file", str(ca.ca_cert)]
    assert _top(*argv) == 0
    assert capsys.readouterr().out.startswith("no complete window with queries yet")


def test_a_wrong_password_says_the_credentials_were_refused(
    secured: str, ca: Authority, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(PASSWORD_ENV, "not-the-password")
    for queries in ([], ["--queries"]):
        assert _top(secured, "--user", USER, "--ca-file", str(ca.ca_cert), *queries) == 1
        err = capsys.readouterr().err
        assert f"refused the credentials of user '{USER}' (HTTP 401)" in err, err
        assert "not-the-password" not in err and "is evald running" not in err, err


@pytest.mark.usefixtures("password")
def test_live_view_stops_on_refused_credentials_instead_of_retrying(
    secured: str, ca: Authority, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(PASSWORD_ENV, "not-the-password")
    argv = ["top", secured, "--user", USER, "--ca-file", str(ca.ca_cert), "--interval", "0.1"]
    assert cli.main(argv) == 1
    assert "refused the credentials" in capsys.readouterr().err


@pytest.mark.usefixtures("password")
def test_no_user_names_the_option(
    secured: str, ca: Authority, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _top(secured, "--ca-file", str(ca.ca_cert)) == 1
    err = capsys.readouterr().err
    assert "asks for basic auth" in err and "--user NAME" in err and PASSWORD_ENV in err, err


def test_user_without_a_password_and_no_terminal_exits_2_naming_the_variable(
    secured: str, ca: Authority, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False, raising=False)
    assert _top(secured, "--user", USER, "--ca-file", str(ca.ca_cert)) == 2
    err = capsys.readouterr().err
    assert err.startswith("evald top: --user prometheus needs a password") and PASSWORD_ENV in err


def test_on_a_terminal_the_password_is_prompted_for(
    secured: str, ca: Authority, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import getpass

    prompts: list[str] = []

    def ask(prompt: str) -> str:
        prompts.append(prompt)
        return PASSWORD

    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(getpass, "getpass", ask)
    assert _top(secured, "--user", USER, "--ca-file", str(ca.ca_cert)) == 0
    assert prompts == [f"password for {USER} at {secured}: "]
    assert capsys.readouterr().out.startswith("evald top · ")


@pytest.mark.usefixtures("password")
def test_a_private_ca_without_ca_file_names_the_option(
    secured: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _top(f"https://{secured}", "--user", USER) == 1
    err = capsys.readouterr().err
    assert "certificate is not trusted" in err and "--ca-file" in err, err


@pytest.mark.usefixtures("password")
def test_a_ca_file_of_another_ca_says_so(
    secured: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = make_ca(tmp_path / "other")
    assert _top(secured, "--user", USER, "--ca-file", str(other.ca_cert)) == 1
    err = capsys.readouterr().err
    assert f"not signed by the CA in --ca-file {other.ca_cert}" in err, err


@pytest.mark.usefixtures("password")
def test_a_certificate_for_another_name_says_which_address_to_use(
    ca: Authority, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cert, key = server_cert_for(ca, "elsewhere", "DNS:evald.example")
    path = write_web_config(tmp_path / "web.yml", ca, cert_file=str(cert), key_file=str(key))
    with MetricsServer("127.0.0.1:0", web=load_web_config(path)) as server:
        assert _top(f"127.0.0.1:{server.port}", "--user", USER, "--ca-file", str(ca.ca_cert)) == 1
    err = capsys.readouterr().err
    assert "certificate is not for this address" in err and "subjectAltName" in err, err
    assert "--ca-file" not in err, err  # the CA is right: naming it would mislead


def test_https_to_a_plain_http_endpoint_suggests_http(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """evald's plain server never answers a TLS hello (it waits for a request line): the
    handshake times out, after one second with --interval 0.1."""
    with MetricsServer("127.0.0.1:0") as server:
        assert _top(f"https://127.0.0.1:{server.port}") == 1
    err = capsys.readouterr().err
    assert "TLS handshake timed out" in err and "use http://" in err, err
    assert "is evald running" not in err, err


@pytest.mark.usefixtures("password")
def test_plain_http_to_a_tls_endpoint_suggests_https(
    secured: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _top(secured, "--user", USER) == 1
    err = capsys.readouterr().err
    assert f"http://{secured}/metrics" in err and "use an https:// URL" in err, err
    assert "is evald running" not in err, err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["http://127.0.0.1:9", "--ca-file", "ca.crt"], "--ca-file is for TLS"),
        (["127.0.0.1:9", "--cert-file", "c.crt"], "--cert-file and --key-file go together"),
        (["127.0.0.1:9", "--ca-file", "missing.crt"], "--ca-file missing.crt: not a readable"),
        (["127.0.0.1:9", "--user", "a:b"], "--user: a name"),
    ],
)
def test_bad_tls_or_auth_options_exit_2(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _top(*argv) == 2
    assert capsys.readouterr().err.startswith(f"evald top: {says}")


@pytest.fixture
def client_verified(ca: Authority, tmp_path: Path) -> Iterator[str]:
    """HOST:PORT of a server that requires a client certificate signed by the test CA."""
    path = write_web_config(
        tmp_path / "web.yml",
        ca,
        client_auth_type="RequireAndVerifyClientCert",
        client_ca_file=str(ca.ca_cert),
    )
    with MetricsServer("127.0.0.1:0", web=load_web_config(path)) as server:
        yield f"127.0.0.1:{server.port}"


@pytest.mark.usefixtures("password")
def test_a_client_certificate_is_sent_and_its_absence_named(
    client_verified: str, ca: Authority, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = [client_verified, "--user", USER, "--ca-file", str(ca.ca_cert)]
    assert _top(*base) == 1
    err = capsys.readouterr().err
    assert "client certificate" in err and "--cert-file and --key-file" in err, err
    assert _top(*base, "--cert-file", str(ca.client_cert), "--key-file", str(ca.client_key)) == 0
    assert capsys.readouterr().out.startswith("evald top · ")
    other = make_ca(tmp_path / "other")  # a certificate the server's client_ca_file did not sign
    assert (
        _top(*base, "--cert-file", str(other.client_cert), "--key-file", str(other.client_key)) == 1
    )
    err = capsys.readouterr().err
    assert f"refuse the client certificate --cert-file {other.client_cert}" in err, err
    assert "client_ca_file" in err, err


def test_credentials_do_not_follow_a_redirect(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A redirect would carry the Authorization header to wherever it points: not followed."""
    seen: list[str | None] = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere) as other:

        class Redirect(Elsewhere):
            def do_GET(self) -> None:
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.1:{other.server_port}/metrics")
                self.send_header("Content-Length", "0")
                self.end_headers()

        with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect) as server:
            for each in (other, server):
                threading.Thread(target=each.serve_forever, daemon=True).start()
            monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
            try:
                assert _top(f"127.0.0.1:{server.server_port}", "--user", USER) == 1
            finally:
                server.shutdown()
                other.shutdown()
    assert seen == []
    assert "answered HTTP 302" in capsys.readouterr().err


def _secret(path: Path, text: str, mode: int = 0o600) -> str:
    path.write_text(text, encoding="utf-8", newline="")
    path.chmod(mode)
    return str(path)


def test_the_password_is_read_from_the_first_line_of_password_file(
    secured: str,
    ca: Authority,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """For scripts and secrets mounted as files: no terminal, and the file wins over a stale
    $EVALD_TOP_PASSWORD; with or without a final newline, LF or CRLF."""
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False, raising=False)
    monkeypatch.setenv(PASSWORD_ENV, "not-the-password")
    base = [secured, "--user", USER, "--ca-file", str(ca.ca_cert)]
    for i, text in enumerate([PASSWORD, f"{PASSWORD}\n", f"{PASSWORD}\r\nsecond line\n"]):
        secret = _secret(tmp_path / f"password{i}", text)
        assert _top(*base, "--password-file", secret) == 0
        out, err = capsys.readouterr()
        assert out.startswith(f"evald top · {secured} · ") and err == "", (out, err)
    # a password with spaces, read as written: the server refuses this one, and says so
    assert _top(*base, "--password-file", _secret(tmp_path / "spaced", f" {PASSWORD}\n")) == 1
    assert "refused the credentials" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (None, "No such file or directory"),
        ("", "its first line is empty"),
        ("\nsecret\n", "its first line is empty"),
        (b"\xff\xfe\n", "its first line is not UTF-8 text"),
    ],
)
def test_a_password_file_without_a_password_exits_2_naming_it(
    tmp_path: Path, text: str | bytes | None, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "password"
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        _secret(path, text)
    assert _top("127.0.0.1:9", "--user", USER, "--password-file", str(path)) == 2
    assert capsys.readouterr().err == f"evald top: --password-file {path}: {says}\n"


def test_a_password_file_needs_a_user(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret = _secret(tmp_path / "password", PASSWORD)
    assert _top("127.0.0.1:9", "--password-file", secret) == 2
    assert capsys.readouterr().err.startswith("evald top: --password-file is --user's password")


def _client(url: str, *extra: str, seen: list[str] | None = None) -> Client:
    args = build_parser().parse_args(["top", url, "--user", USER, *extra])
    return from_args(
        args, url, environ={PASSWORD_ENV: PASSWORD}, warn=seen.append if seen is not None else None
    )


def test_a_password_file_readable_by_everyone_is_warned_about(tmp_path: Path) -> None:
    """Warned, not refused: Docker mounts secrets 0444 and Kubernetes 0644 by default."""
    url = "https://127.0.0.1:9/metrics"
    for mode, warned in ((0o600, False), (0o640, False), (0o644, True), (0o444, True)):
        seen: list[str] = []
        secret = _secret(tmp_path / f"password{mode:o}", PASSWORD, mode)
        assert _client(url, "--password-file", secret, seen=seen).auth == (USER, PASSWORD)
        assert seen == (
            [f"warning: --password-file {secret} is readable by every user (chmod 600 it)"]
            if warned
            else []
        ), oct(mode)


@pytest.mark.parametrize(
    ("url", "warned"),
    [
        ("http://evald.example:9464/metrics", "evald.example"),
        ("http://10.0.0.7:9464/metrics", "10.0.0.7"),
        ("http://[2001:db8::1]:9464/metrics", "2001:db8::1"),
        ("http://127.0.0.1:9464/metrics", None),
        ("http://127.3.2.1:9464/metrics", None),
        ("http://localhost:9464/metrics", None),
        ("http://LOCALHOST:9464/metrics", None),
        ("http://[::1]:9464/metrics", None),
        ("https://evald.example:9464/metrics", None),
    ],
)
def test_credentials_over_plain_http_to_another_host_are_warned_about(
    url: str, warned: str | None
) -> None:
    seen: list[str] = []
    assert _client(url, seen=seen).auth == (USER, PASSWORD)
    assert seen == (
        []
        if warned is None
        else [
            f"warning: --user {USER}'s password goes to {warned} over plain http://, readable "
            "on the way: serve TLS and use https:// (docs/security.md)"
        ]
    )


def test_the_plain_http_warning_is_one_line_on_stderr_before_the_prompt(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    order: list[str] = []

    def ask(prompt: str) -> str:
        order.append(capsys.readouterr().err)
        return PASSWORD

    args = build_parser().parse_args(["top", "evald.example:9464", "--user", USER])
    url = "http://evald.example:9464/metrics"
    from_args(args, url, environ={}, tty=lambda: True, prompt=ask)
    assert len(order) == 1 and order[0].startswith("evald top: warning: --user ")
    assert order[0].count("\n") == 1 and order[0].endswith("(docs/security.md)\n")
    # without --user nothing is sent, so nothing is said
    from_args(build_parser().parse_args(["top", "evald.example:9464"]), url)
    assert capsys.readouterr().err == ""
