"""ZeroMQ plumbing: endpoints of one deployment, and typed send/receive of `messages` over PUSH/PULL sockets.

Every process binds one PULL socket for everything addressed to it and connects PUSH sockets to the
processes it talks to. On one host the endpoints are `ipc://` paths in a private (0700) run directory; for
subservers on other hosts, `tcp://HOST:PORT`.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field

import msgspec
import zmq

from tokenrouter.runtime import messages as m


@dataclass(slots=True)
class Endpoints:
    launcher: str
    frontend: str
    subservers: dict[str, str] = field(default_factory=dict)

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
        return {"launcher": self.launcher, "frontend": self.frontend, "subservers": dict(self.subservers)}

    @classmethod
    def parse(cls, text: str) -> Endpoints:
        """The endpoints given on a command line: `to_dict()` as JSON, or the path of a file holding it.
        Raises ValueError with a message for users."""
        source = "--endpoints"
        if not text.lstrip().startswith("{"):
            try:
                text, source = open(text, encoding="utf-8").read(), text  # noqa: SIM115
            except OSError as e:
                raise ValueError(
                    f"--endpoints: neither JSON nor a readable file: {text} ({e.strerror})"
                ) from None
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{source}: not valid JSON: {e}") from None
        if (
            not isinstance(d, dict)
            or not all(isinstance(d.get(k), str) for k in ("launcher", "frontend"))
            or not isinstance(d.get("subservers"), dict)
            or not all(isinstance(v, str) for v in d["subservers"].values())
        ):
            raise ValueError(
                f'{source}: expected {{"launcher": URL, "frontend": URL, "subservers": {{MODEL: URL}}}} '
                "(the JSON that `tokenrouter serve` prints)"
            )
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d: dict) -> Endpoints:
        return cls(launcher=d["launcher"], frontend=d["frontend"], subservers=dict(d["subservers"]))


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
        self.sock.bind(addr)
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


__all__ = ["Endpoints", "Receiver", "Sender", "decode_union", "m", "tcp_url"]
