"""Who the front door says a client is: the real nginx, in front of a server that echoes the
client header it was given (in place of the body check and Triton). A named key's clients get
its name, API_KEY's and keyless clients their address, a forged header is replaced, a wrong or
missing key is refused, and keys match exactly."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from python_backend.common.contract import CLIENT_PARAMETER, KEY_CLASS_PARAMETER
from tools.front_door import FrontDoor, FrontDoorSettings
from tools.triton_server import free_port

SHARED = "shared-key-0123456789"
TEAM_A = "team-a-key-0123456789"
TEAM_B = "TEAM/b+key=0123456789"
BULK = "bulk-key-0123456789xyz"


class Echo(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps(
            {
                "client": self.headers.get(CLIENT_PARAMETER),
                "class": self.headers.get(KEY_CLASS_PARAMETER),
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def door(tmp_path_factory):
    echo = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=echo.serve_forever, daemon=True).start()
    here = f"127.0.0.1:{echo.server_port}"
    root = tmp_path_factory.mktemp("door")
    keys = root / "api-keys"
    keys.write_text(f"team-a {TEAM_A}\nteam-b {TEAM_B}\nbulk {BULK} 2\n")
    settings = FrontDoorSettings(
        triton_http_address=here,
        triton_grpc_address=here,
        triton_metrics_address=here,
        openai_address=here,
        check_http_address=here,
        check_grpc_address=here,
        check_stream_address=here,
        public_address="127.0.0.1",
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        api_key=SHARED,
        api_keys_file=str(keys),
    )
    with FrontDoor(settings, root / "nginx") as running:
        yield running
    echo.shutdown()


def seen(door, authorization: str | None, forged: dict[str, str] | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **(forged or {})}
    if authorization is not None:
        headers["Authorization"] = authorization
    request = urllib.request.Request(
        f"http://127.0.0.1:{door.settings.http_port}/v2/models/m/infer", b"{}", headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, {}


def client_seen(door, authorization: str | None, forged: str | None = None) -> tuple[int, str]:
    code, echoed = seen(door, authorization, {CLIENT_PARAMETER: forged} if forged else None)
    return code, echoed.get("client", "")


def test_a_named_keys_clients_get_its_name(door):
    assert client_seen(door, f"Bearer {TEAM_A}") == (200, "team-a")
    assert client_seen(door, f"bearer {TEAM_B}") == (200, "team-b")  # the scheme in any case


def test_the_shared_keys_clients_are_named_by_their_address(door):
    assert client_seen(door, f"Bearer {SHARED}") == (200, "127.0.0.1")


def test_a_forged_client_header_is_replaced(door):
    assert client_seen(door, f"Bearer {TEAM_A}", forged="team-b") == (200, "team-a")
    assert client_seen(door, f"Bearer {SHARED}", forged="team-b") == (200, "127.0.0.1")


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer nope-nope-nope-nope", f"Bearer {TEAM_A.upper()}", f"Bearer {TEAM_A}x", TEAM_A],
    ids=["none", "wrong", "case changed", "longer", "no scheme"],
)
def test_a_missing_or_inexact_key_is_refused(door, authorization):
    assert client_seen(door, authorization)[0] == 401


def test_a_keys_class_reaches_the_model_and_no_client_can_set_it(door):
    """A key of the keys file with a class: its clients are named by it and the door sends the
    class; other keys send none, and a client's own header is dropped."""
    forged = {KEY_CLASS_PARAMETER: "1"}
    assert seen(door, f"Bearer {BULK}", forged) == (200, {"client": "bulk", "class": "2"})
    assert seen(door, f"Bearer {TEAM_A}", forged) == (200, {"client": "team-a", "class": None})
    assert seen(door, f"Bearer {SHARED}", forged)[1]["class"] is None
