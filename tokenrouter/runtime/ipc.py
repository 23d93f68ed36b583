"""ZeroMQ plumbing: endpoints of one deployment, and typed send/receive of `messages` over PUSH/PULL sockets.

Every process binds one PULL socket for everything addressed to it and connects PUSH sockets to the
processes it talks to. On one host the endpoints are `ipc://` paths in a private (0700) run directory; for
subservers on other hosts, `tcp://HOST:PORT`.

Over tcp:// any process that reaches a port could send messages, so a `--tcp` deployment has a key: one CURVE
key pair that the launcher makes and hands to its processes in the endpoints (`Endpoints.key`, the secret
key in Z85). `secure_context` makes every socket of a ZeroMQ context speak CURVE with it, and its bound
sockets accept only peers that prove they hold it (a ZAP handler); a message from anyone else is never
delivered.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field

import msgspec
import zmq
import zmq.auth.thread

from tokenrouter.runtime import messages as m


@dataclass(slots=True)
class Endpoints:
    launcher: str
    frontend: str
    subservers: dict[str, str] = field(default_factory=dict)
    key: str | None = None  # the deployment's CURVE secret key (Z85), with tcp://; None: no CURVE

    @classmethod
    def ipc(cls, models: list[str], run_dir: str | None = None) -> Endpoints:
        run_dir = run_dir or tempfile.mkdtemp(prefix="tokenrouter-")
        os.chmod(run_dir, 0o700)
        return cls(
            launcher=f"ipc://{run_dir}/launcher",
            frontend=f"ipc://{run_dir}/frontend",
            subservers={name: f"ipc://{run_dir}/sub-{name}" for name in models},
        )

    @classmethod
    def tcp(cls, models: list[str], host: str = "127.0.0.1", base_port: int = 28100) -> Endpoints:
        return cls(
            launcher=f"tcp://{host}:{base_port}",
            frontend=f"tcp://{host}:{base_port + 1}",
            subservers={name: f"tcp://{host}:{base_port + 2 + i}" for i, name in enumerate(models)},
        )

    def to_dict(self) -> dict:
        d = {"launcher": self.launcher, "frontend": self.frontend, "subservers": dict(self.subservers)}
        return d if self.key is None else {**d, "key": self.key}

    @classmethod
    def parse(cls, text: str) -> Endpoints:
        """The endpoints given on a command line: `to_dict()` as JSON, or the path of a file holding it.
        Raises ValueError with a message for users."""
        text, source = _endpoints_text(text)
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{source}: not valid JSON: {e}") from None
        if (
            not isinstance(d, dict)
            or not all(isinstance(d.get(k), str) for k in ("launcher", "frontend"))
            or not isinstance(d.get("subservers"), dict)
            or not all(isinstance(v, str) for v in d["subservers"].values())
            or not isinstance(d.get("key", ""), str)
        ):
            raise ValueError(
                f'{source}: expected {{"launcher": URL, "frontend": URL, "subservers": {{MODEL: URL}}}} '
                "(the JSON that `tokenrouter serve` prints)"
            )
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d: dict) -> Endpoints:
        return cls(
            launcher=d["launcher"], frontend=d["frontend"], subservers=dict(d["subservers"]), key=d.get("key")
        )


def new_key() -> str:
    """A fresh deployment key: a CURVE secret key in Z85."""
    return zmq.curve_keypair()[1].decode()


def secure_context(ctx: zmq.Context, key: str | None) -> zmq.auth.thread.ThreadAuthenticator | None:
    """With a deployment key: every socket `ctx` makes from now on speaks CURVE with the deployment's key pair,
    and a ZAP handler (returned: `stop()` it before the context ends) lets only peers holding the same key
    connect to its bound sockets (`bind`). Without a key (ipc://, private run directory): nothing."""
    if key is None:
        return None
    if not zmq.has("curve"):
        raise RuntimeError("--tcp needs ZeroMQ with CURVE (libsodium), which this pyzmq lacks")
    secret = key.encode()
    public = zmq.curve_public(secret)
    # the handler's own (inproc) socket: on a shadow of the context, which has none of the defaults below
    auth = zmq.auth.thread.ThreadAuthenticator(zmq.Context(shadow=ctx.underlying))
    auth.start()
    auth.configure_curve_callback("*", _OneKey(public))
    ctx.setsockopt(zmq.CURVE_SECRETKEY, secret)
    ctx.setsockopt(zmq.CURVE_PUBLICKEY, public)
    ctx.setsockopt(zmq.CURVE_SERVERKEY, public)
    return auth


class _OneKey:
    """The ZAP credentials check: the deployment's own public key only."""

    def __init__(self, public: bytes) -> None:
        self.public = public

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.public


def bind(sock: zmq.Socket, addr: str) -> None:
    """Bind `sock`, as the CURVE server where its context is secured (`secure_context`)."""
    if zmq.CURVE_SECRETKEY in sock.context.sockopts:
        sock.curve_server = True
    sock.bind(addr)


def tcp_url(host: str, port: int) -> str:
    """`tcp://HOST:PORT` (an IPv6 address in brackets)."""
    host = host.strip("[]")
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


_encoder = msgspec.msgpack.Encoder()


class Receiver:
    """A bound PULL socket that decodes one message union."""

    def __init__(self, ctx: zmq.Context, addr: str, union: type, unbounded: bool = False) -> None:
        self.sock = ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        if unbounded:  # no receive high-water mark: what arrives while the owner is busy queues here
            self.sock.setsockopt(zmq.RCVHWM, 0)
        bind(self.sock, addr)
        self._decoder = msgspec.msgpack.Decoder(union)

    def recv(self, block: bool = True):
        data = self.sock.recv(0 if block else zmq.NOBLOCK)
        return self._decoder.decode(data)

    def poll(self, timeout_ms: int) -> bool:
        return bool(self.sock.poll(timeout_ms))

    def drain(self) -> list:
        """All messages already queued, without blocking."""
        out = []
        while True:
            try:
                out.append(self.recv(block=False))
            except zmq.Again:
                return out


class Sender:
    """A connected PUSH socket."""

    def __init__(self, ctx: zmq.Context, addr: str, unbounded: bool = False) -> None:
        self.sock = ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 0)
        if unbounded:  # no send high-water mark: a slow or absent receiver never blocks a send
            self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.connect(addr)

    def send(self, msg: msgspec.Struct) -> None:
        self.sock.send(_encoder.encode(msg))


def decode_union(data: bytes, union: type):
    return msgspec.msgpack.decode(data, type=union)


__all__ = [
    "Endpoints",
    "Receiver",
    "Sender",
    "bind",
    "decode_union",
    "m",
    "new_key",
    "secure_context",
    "tcp_url",
]


def _endpoints_text(text: str) -> tuple[str, str]:
    """(the endpoints JSON, where it came from): `text` itself, or the file it names."""
    if text.lstrip().startswith("{"):
        return text, "--endpoints"
    try:
        return open(text, encoding="utf-8").read(), text  # noqa: SIM115
    except OSError as e:
        raise ValueError(f"--endpoints: neither JSON nor a readable file: {text} ({e.strerror})") from None
