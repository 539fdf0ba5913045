"""The front door: nginx in front of Triton, the only public entry (see docs/SECURITY.md).

One template, docker/nginx/front-door.conf.template, serves every way the project runs. Here it
is rendered the way the official nginx image renders it (envsubst over the names the settings
define; nginx's own $variables stay) and included in an nginx.conf of our own, whose pid file,
logs and temporary files live under build/, so nginx runs as a child of the launcher, needs no
system service and no root.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from python_backend.common.values import (
    SIZE_PATTERN,
    BadValue,
    Parser,
    int_at_least,
    matching,
    parse_bool,
    text,
)
from tools.triton_server import free_port, local_host, set_parent_death_signal

ROOT = Path(__file__).resolve().parents[1]
NGINX_FILES = ROOT / "docker" / "nginx"
TEMPLATE = NGINX_FILES / "front-door.conf.template"  # http{}: routes, keys, limits
STREAM_TEMPLATE = NGINX_FILES / "front-door.conf.stream-template"  # stream{}: the public ports
TEMPLATES = (TEMPLATE, STREAM_TEMPLATE)
SCRIPT = NGINX_FILES / "front-door.js"  # the repeated-header check (njs)

# An API key goes into nginx's configuration as a literal string: only characters that need no
# quoting there (those of base64, base64url and hex keys)
API_KEY_PATTERN = re.compile(r"[A-Za-z0-9._~+/=-]{16,256}")


class FrontDoorError(RuntimeError):
    """A setting the front door cannot run with, or an nginx that did not start."""


API_KEY_RULE = "16 to 256 characters of A-Z a-z 0-9 . _ ~ + / = -"
# the one rule for a key: none (empty), or one that needs no quoting in the config
parse_api_key = matching(
    f"|{API_KEY_PATTERN.pattern}",
    f"{API_KEY_RULE} (for example: openssl rand -hex 32), or empty for no key",
)
parse_size = matching(SIZE_PATTERN.pattern, "like 8m, 512k or 1048576")
# a size that must hold something: not 0
parse_positive_size = matching(
    f"(?!0+[kKmM]?$){SIZE_PATTERN.pattern}", "above 0, like 8m, 512k or 1048576"
)


def check_api_key(key: str, name: str = "API_KEY") -> str:
    """``parse_api_key`` with the front door's error."""
    try:
        return str(parse_api_key(key, name))
    except BadValue as err:
        raise FrontDoorError(str(err)) from None


CLIENT_NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")
# the keys map's values (docker/nginx/10-api-keys.sh writes the same): a client's name, or
SHARED_KEY = "-"  # API_KEY's clients: named by their address, as without a key
NO_KEY = "!"  # keys are required and none matched


CLASS_PATTERN = re.compile(r"[1-9][0-9]{0,3}")  # a key's class: 1 to 9999


def read_api_keys(path: Path) -> dict[str, str]:
    """``API_KEYS``: a file of ``name key`` or ``name key class`` lines (blank lines and ``#``
    comments skipped), as key -> the map's value: the name, or ``name/class`` (the highest
    class the key's clients may ask for, and their default); a bad line, a name or key twice,
    is a FrontDoorError naming its line. Read as
    the image's shell script reads it: lines end at LF (a CR before it dropped), words are
    separated by spaces and tabs only, and any other byte belongs to a word."""
    try:
        text = path.read_bytes().decode("utf-8", "surrogateescape")
    except OSError as err:
        raise FrontDoorError(f"API_KEYS: cannot read {path}: {err.strerror}") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    keys: dict[str, str] = {}
    names: set[str] = set()
    for number, line in enumerate(lines, 1):
        words = [w for w in re.split("[ \t]+", line.removesuffix("\r")) if w]
        if not words or words[0].startswith("#"):
            continue
        where = f"API_KEYS ({path}) line {number}"
        if len(words) not in (2, 3):
            raise FrontDoorError(f"{where}: write `name key` or `name key class`")
        name, key = words[:2]
        if not CLIENT_NAME_PATTERN.fullmatch(name) or name in (SHARED_KEY, NO_KEY):
            raise FrontDoorError(f"{where}: a name is 1 to 64 characters of A-Z a-z 0-9 . _ -")
        if not API_KEY_PATTERN.fullmatch(key):
            raise FrontDoorError(f"{where}: a key is {API_KEY_RULE}")
        if len(words) == 3 and not CLASS_PATTERN.fullmatch(words[2]):
            raise FrontDoorError(f"{where}: a class is a whole number from 1 to 9999")
        if key in keys or name in names:
            raise FrontDoorError(f"{where}: {'key' if key in keys else 'name'} given twice")
        names.add(name)
        keys[key] = "/".join(words[:1] + words[2:])
    return keys


def keys_map(api_key: str, named: dict[str, str]) -> str:
    """The body of the front door's map from Authorization to the client's name: each key
    compared exactly (a case-sensitive regular expression, the key quoted literally; the scheme
    in any case, as HTTP says), then the default."""
    entries = ([(api_key, SHARED_KEY)] if api_key else []) + list(named.items())
    lines = [f'"~^(?i:bearer) \\Q{key}\\E$" "{name}";' for key, name in entries]
    lines.append(f'default "{NO_KEY if entries else ""}";')
    return "\n".join(lines) + "\n"


def random_key() -> str:
    return secrets.token_hex(32)


def from_env(variable: str, parse: Parser) -> dict[str, object]:
    """A setting's declaration: the environment variable that sets it, and its parser."""
    return {"env": variable, "parse": parse}


def declared(cls: type) -> list[Any]:
    """The fields of a settings dataclass that an environment variable sets."""
    return [f for f in fields(cls) if "env" in f.metadata]


def read_env(cls: type, env: dict[str, str] | None = None) -> dict[str, object]:
    """The declared settings the environment sets (an empty value is unset), parsed; a bad value
    raises BadValue naming the variable."""
    env = dict(os.environ if env is None else env)
    out: dict[str, object] = {}
    for f in declared(cls):
        raw = env.get(f.metadata["env"], "").strip()
        if raw:
            out[f.name] = f.metadata["parse"](raw, f.metadata["env"])
    return out


def as_env_text(value: object) -> str:
    """A setting's value as the environment writes it (booleans as true and false)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def env_defaults(cls: type) -> dict[str, str]:
    """Each declared variable's default, as text: what compose and the manifests restate."""
    return {f.metadata["env"]: as_env_text(f.default) for f in declared(cls)}


@dataclass(frozen=True)
class FrontDoorSettings:
    """Everything the template names; each setting an environment variable sets is declared here
    once, with its variable, default and parser (``read_env``)."""

    triton_http_address: str  # host:port of Triton's own HTTP server (loopback or internal)
    triton_grpc_address: str
    triton_metrics_address: str
    openai_address: str  # host:port of the OpenAI-compatible adapter (openai_api), served at /v1
    # host:port of the body check's servers (body_check), where inference goes: HTTP, gRPC
    # ModelInfer, gRPC ModelStreamInfer
    check_http_address: str
    check_grpc_address: str
    check_stream_address: str
    # host:port of the launcher's own metrics (tools.serve: serve_restarts_total), appended to
    # Triton's at /metrics
    serve_metrics_address: str = "127.0.0.1:18008"
    public_address: str = field(default="0.0.0.0", metadata=from_env("PUBLIC_ADDRESS", text))
    http_port: int = field(default=8000, metadata=from_env("HTTP_PORT", int_at_least(1)))
    grpc_port: int = field(default=8001, metadata=from_env("GRPC_PORT", int_at_least(1)))
    metrics_port: int = field(default=8002, metadata=from_env("METRICS_PORT", int_at_least(1)))
    # metrics on the public address instead of loopback
    metrics_public: bool = field(default=False, metadata=from_env("METRICS_PUBLIC", parse_bool))
    api_key: str = field(default="", metadata=from_env("API_KEY", parse_api_key))  # "": no key
    # a file of `name key` lines: each key's clients named (the queue's shares), "" for none
    api_keys_file: str = field(default="", metadata=from_env("API_KEYS", text))
    # nginx size syntax
    max_body_size: str = field(default="8m", metadata=from_env("MAX_BODY_SIZE", parse_size))
    # per header line; 4 such buffers bound all headers
    max_header_size: str = field(default="8k", metadata=from_env("MAX_HEADER_SIZE", parse_size))
    # header, body and send timeouts (between two reads)
    client_timeout_s: int = field(
        default=10, metadata=from_env("CLIENT_TIMEOUT_S", int_at_least(1))
    )
    # longest wait for Triton's answer: the backstop
    upstream_timeout_s: int = field(
        default=60, metadata=from_env("UPSTREAM_TIMEOUT_S", int_at_least(1))
    )
    # requests in progress per client (each HTTP/2 stream counts)
    max_connections_per_client: int = field(
        default=256, metadata=from_env("MAX_CONNECTIONS_PER_CLIENT", int_at_least(1))
    )
    # open connections per client address, idle keep-alive ones too
    max_open_connections_per_client: int = field(
        default=512, metadata=from_env("MAX_OPEN_CONNECTIONS_PER_CLIENT", int_at_least(1))
    )
    # where the TCP layer passes connections to the HTTP servers: loopback ports of their own
    inner_http_address: str = field(default_factory=lambda: f"127.0.0.1:{free_port()}")
    inner_grpc_address: str = field(default_factory=lambda: f"127.0.0.1:{free_port()}")

    def __post_init__(self) -> None:
        for f in declared(FrontDoorSettings):  # built in code: the same rules as from the env
            try:
                f.metadata["parse"](as_env_text(getattr(self, f.name)), f.metadata["env"])
            except BadValue as err:
                raise FrontDoorError(str(err)) from None

    @staticmethod
    def env_overrides(env: dict[str, str] | None = None) -> dict[str, object]:
        """The settings the environment sets, by field name."""
        try:
            return read_env(FrontDoorSettings, env)
        except BadValue as err:
            raise FrontDoorError(str(err)) from None

    def named_keys(self) -> dict[str, str]:
        """API_KEYS read: key -> client name."""
        named = read_api_keys(Path(self.api_keys_file)) if self.api_keys_file else {}
        if self.api_key and self.api_key in named:
            raise FrontDoorError("API_KEY is also in API_KEYS: give each key once")
        return named

    @property
    def stream_body_size(self) -> str:
        """A gRPC stream's bound at the door: none where the body check bounds each of its
        messages, else MAX_BODY_SIZE for the whole stream (streams straight to Triton)."""
        return self.max_body_size if self.check_stream_address == self.triton_grpc_address else "0"

    def template_values(self, keys_path: str = "keys.map") -> dict[str, str]:
        """The template's values; ``keys_path``: where the keys map (``keys_map``) is written."""
        metrics_host = self.public_address if self.metrics_public else "127.0.0.1"
        return {
            "TRITON_HTTP_ADDRESS": self.triton_http_address,
            "TRITON_GRPC_ADDRESS": self.triton_grpc_address,
            "TRITON_METRICS_ADDRESS": self.triton_metrics_address,
            "OPENAI_ADDRESS": self.openai_address,
            "CHECK_HTTP_ADDRESS": self.check_http_address,
            "CHECK_GRPC_ADDRESS": self.check_grpc_address,
            "CHECK_STREAM_ADDRESS": self.check_stream_address,
            "SERVE_METRICS_ADDRESS": self.serve_metrics_address,
            "PUBLIC_HTTP_LISTEN": f"{self.public_address}:{self.http_port}",
            "PUBLIC_GRPC_LISTEN": f"{self.public_address}:{self.grpc_port}",
            "METRICS_LISTEN": f"{metrics_host}:{self.metrics_port}",
            "FRONT_DOOR_KEYS": keys_path,
            "MAX_BODY_SIZE": self.max_body_size,
            "STREAM_BODY_SIZE": self.stream_body_size,
            "MAX_HEADER_SIZE": self.max_header_size,
            "CLIENT_TIMEOUT_S": str(self.client_timeout_s),
            "UPSTREAM_TIMEOUT_S": str(self.upstream_timeout_s),
            "MAX_CONNECTIONS_PER_CLIENT": str(self.max_connections_per_client),
            "MAX_OPEN_CONNECTIONS_PER_CLIENT": str(self.max_open_connections_per_client),
            "INNER_HTTP_ADDRESS": self.inner_http_address,
            "INNER_GRPC_ADDRESS": self.inner_grpc_address,
            "FRONT_DOOR_SCRIPT": str(SCRIPT),
        }


NAME = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)\}")


def template_names() -> set[str]:
    """The ${NAME}s the front door's templates use: what every deployment must set."""
    return {name for template in TEMPLATES for name in NAME.findall(template.read_text())}


def render_template(text: str, values: dict[str, str]) -> str:
    """${NAME} -> value for the names given, as the nginx image's envsubst does; others stay."""
    return NAME.sub(lambda m: values.get(m.group(1), m.group(0)), text)


WORKER_USER = ("nobody", "nogroup")  # who the worker processes run as when started by root


def dynamic_modules(build: str) -> list[Path]:
    """The module files this nginx must load for the front door, from what ``nginx -V`` printed
    (``build``): the stream module where it is built as one (Debian's), and njs, which always is
    (Debian's libnginx-mod-stream and libnginx-mod-http-js; the nginx image carries both)."""
    options = build.split()
    found = [o.split("=", 1)[1] for o in options if o.startswith("--modules-path=")]
    prefix = [o.split("=", 1)[1] for o in options if o.startswith("--prefix=")]
    folder = Path(found[0] if found else f"{prefix[0] if prefix else '/usr/share/nginx'}/modules")
    wanted = ["ngx_http_js_module.so"]
    if "--with-stream=dynamic" in options:
        wanted.insert(0, "ngx_stream_module.so")
    elif "--with-stream" not in options:
        raise FrontDoorError("this nginx is built without its stream module")
    paths = [folder / name for name in wanted]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise FrontDoorError(
            f"nginx modules missing from {folder}: {', '.join(missing)} (`make setup` installs "
            "Debian's libnginx-mod-stream and libnginx-mod-http-js)"
        )
    return paths


def main_config(
    prefix: Path,
    included: Path,
    stream_included: Path,
    temp_dir: Path,
    modules: list[Path],
    worker_connections: int = 8192,
) -> str:
    """An nginx.conf that keeps its files under `prefix` and includes the rendered templates.
    Each public connection holds four of ``worker_connections``: the client's and the TCP
    layer's, the HTTP server's and its upstream's."""
    temp = {name: temp_dir / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
    user = f"user {' '.join(WORKER_USER)};\n" if os.geteuid() == 0 else ""
    return (
        "".join(f"load_module {module};\n" for module in modules)
        + f"{user}worker_processes auto;\n"
        f"pid {prefix / 'nginx.pid'};\n"
        f"error_log {prefix / 'error.log'} warn;\n"
        f"events {{ worker_connections {worker_connections}; }}\n"
        f"stream {{\n    include {stream_included};\n}}\n"
        "http {\n"
        f"    access_log off;\n"
        f"    client_body_temp_path {temp['body']};\n"
        f"    proxy_temp_path {temp['proxy']};\n"
        f"    fastcgi_temp_path {temp['fastcgi']};\n"
        f"    uwsgi_temp_path {temp['uwsgi']};\n"
        f"    scgi_temp_path {temp['scgi']};\n"
        f"    include {included};\n"
        "}\n"
    )


def nginx_binary() -> str:
    for candidate in (shutil.which("nginx"), "/usr/sbin/nginx"):
        if candidate and Path(candidate).is_file():
            return candidate
    raise FrontDoorError("nginx is not installed: `make setup` installs Debian's nginx-light")


def nginx_build() -> str:
    """What ``nginx -V`` prints: its version and configure options."""
    return subprocess.run([nginx_binary(), "-V"], capture_output=True, text=True).stderr


def port_open(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


class FrontDoor:
    """An nginx process in the foreground, in its own process group; a context manager."""

    def __init__(self, settings: FrontDoorSettings, prefix: Path) -> None:
        self.settings = settings
        self.prefix = Path(prefix).resolve()
        self.process: subprocess.Popen[bytes] | None = None
        self._owned_temp: Path | None = None

    @property
    def config_path(self) -> Path:
        return self.prefix / "nginx.conf"

    @property
    def log_path(self) -> Path:
        return self.prefix / "error.log"

    def make_temp_dir(self) -> Path:
        """Where workers spill large request bodies. Started as root, the workers run as nobody
        and must reach it: a fresh directory of theirs under the system's temporary directory
        (the prefix may sit below directories only root may enter)."""
        if os.geteuid() != 0:
            path = self.prefix / "temp"
            path.mkdir(parents=True, exist_ok=True)
            return path
        path = Path(tempfile.mkdtemp(prefix="front-door-"))
        user, group = WORKER_USER
        os.chown(path, pwd.getpwnam(user).pw_uid, grp.getgrnam(group).gr_gid)
        self._owned_temp = path
        return path

    def write_config(self) -> Path:
        self.prefix.mkdir(parents=True, exist_ok=True)
        rendered = self.prefix / "front-door.conf"
        stream_rendered = self.prefix / "front-door-stream.conf"
        keys = self.prefix / "keys.map"
        # created private: never readable by others, not even between writing and a chmod
        keys.unlink(missing_ok=True)
        descriptor = os.open(keys, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(keys_map(self.settings.api_key, self.settings.named_keys()))
        values = self.settings.template_values(str(keys))
        rendered.write_text(render_template(TEMPLATE.read_text(), values))
        stream_rendered.write_text(render_template(STREAM_TEMPLATE.read_text(), values))
        modules = dynamic_modules(nginx_build())
        self.config_path.write_text(
            main_config(self.prefix, rendered, stream_rendered, self.make_temp_dir(), modules)
        )
        return self.config_path

    def check(self) -> None:
        """nginx -t on the written configuration: a clear error before anything listens."""
        result = subprocess.run(
            [nginx_binary(), "-t", "-q", "-p", str(self.prefix), "-c", str(self.config_path)],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise FrontDoorError(f"nginx refused its configuration:\n{result.stderr.strip()}")

    def start(self, timeout_s: float = 10.0) -> FrontDoor:
        self.write_config()
        self.check()
        self.process = subprocess.Popen(
            [
                nginx_binary(),
                "-p",
                str(self.prefix),
                "-c",
                str(self.config_path),
                "-g",
                "daemon off;",
            ],
            start_new_session=True,
            preexec_fn=set_parent_death_signal,
        )
        host = local_host(self.settings.public_address)
        deadline = time.monotonic() + timeout_s
        while not port_open(host, self.settings.http_port):
            if self.process.poll() is not None:
                tail = self.log_path.read_text()[-2000:] if self.log_path.exists() else ""
                raise FrontDoorError(f"nginx exited with code {self.process.returncode}\n{tail}")
            if time.monotonic() > deadline:
                self.stop()
                raise FrontDoorError(f"nginx not listening after {timeout_s:.0f} s")
            time.sleep(0.05)
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGQUIT (finish what is in flight), then whatever is left of the group is killed."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGQUIT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=grace_s)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self._owned_temp is not None:
            shutil.rmtree(self._owned_temp, ignore_errors=True)
            self._owned_temp = None

    def __enter__(self) -> FrontDoor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
