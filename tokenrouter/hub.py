"""Hugging Face hub ids as model paths: `org/name` or `org/name@REVISION` (a branch, tag or commit hash).

A model string that is not a local folder is looked up in the local hub cache (`HF_HUB_CACHE`, else
`HF_HOME/hub`, else `~/.cache/huggingface/hub`) and, when allowed and `HF_HUB_OFFLINE` is not set, fetched
into it with `huggingface_hub`. Only the files TokenRouter loads are fetched: configs, tokenizer files, chat
templates and safetensors weights (never `.bin` or `.pt`)."""

from __future__ import annotations

import os
import re
from pathlib import Path

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+(@[A-Za-z0-9][A-Za-z0-9_./-]*)?$")
FILES = [
    "*.json",
    "*.safetensors",
    "*.jinja",
    "*.txt",
]  # what a model folder needs; weights as safetensors only


class HubError(Exception):
    """A hub id that cannot be had: the message names the id, the cache and the command that fetches it."""


def is_hub_id(text: str) -> bool:
    """`org/name` or `org/name@REVISION`, not a relative path such as `./x/y` or a `.safetensors` file."""
    return bool(_ID.match(text)) and not text.startswith(".") and not text.endswith(".safetensors")


def split(text: str) -> tuple[str, str | None]:
    """(repo id, revision or None) of `org/name[@REVISION]`."""
    repo, _, revision = text.partition("@")
    return repo, revision or None


def cache_dir() -> Path:
    """The hub cache, read from the environment at each call (HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "huggingface" / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def cached(text: str) -> Path | None:
    """The snapshot folder of hub id `text` in the local cache, or None when it is not there."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    repo, revision = split(text)
    try:
        folder = snapshot_download(
            repo, revision=revision, cache_dir=cache_dir(), local_files_only=True, allow_patterns=FILES
        )
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        return None
    return Path(folder) if (Path(folder) / "config.json").is_file() else None


def fetch_command(text: str, source: str | None = None) -> str:
    """The command that puts `text` into the cache: `tokenrouter download SOURCE` when the policy is known."""
    if source:
        return f"tokenrouter download {source}"
    repo, revision = split(text)
    return f"hf download {repo}" + (f" --revision {revision}" if revision else "")


def missing_message(text: str, source: str | None = None) -> str:
    why = " and HF_HUB_OFFLINE is set" if offline() else ""
    return (
        f"'{text}' is not in the hub cache at {cache_dir()}{why}; "
        f"`{fetch_command(text, source)}` fetches it (online)"
    )


def download(text: str) -> Path:
    """Fetch hub id `text` into the cache (a progress bar per file on stderr) and return its snapshot folder;
    a folder already complete in the cache is returned without a download. HubError when offline and not
    cached, or when the hub refuses."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    if offline():
        folder = cached(text)
        if folder is None:
            raise HubError(missing_message(text))
        return folder
    repo, revision = split(text)
    try:
        folder = Path(snapshot_download(repo, revision=revision, cache_dir=cache_dir(), allow_patterns=FILES))
    except LocalEntryNotFoundError:
        raise HubError(
            f"'{text}': the hub cannot be reached and the model is not cached at {cache_dir()}"
        ) from None
    except HfHubHTTPError as e:
        raise HubError(f"'{text}': the hub refused the download: {str(e).splitlines()[0]}") from None
    return check_folder(text, folder)


def check_folder(text: str, folder: Path) -> Path:
    if not (folder / "config.json").is_file():
        raise HubError(f"'{text}' ({folder}) has no config.json; a model is a folder in Hugging Face format")
    if not any(folder.glob("*.safetensors")):
        raise HubError(f"'{text}' ({folder}) has no .safetensors weights; TokenRouter loads safetensors only")
    return folder


def model_folder(path: str, *, fetch: bool, source: str | None = None) -> str:
    """The local folder for a plan's model path: the path itself unless it is a hub id that is not a local
    folder; then the cached snapshot, fetched first when `fetch` and online. HubError when not to be had."""
    if not is_hub_id(path) or Path(path).exists():
        return path
    folder = cached(path)
    if folder is None:
        if not fetch or offline():
            raise HubError(missing_message(path, source))
        folder = download(path)
    return str(check_folder(path, folder))


def resolve_models(plan: dict, *, fetch: bool, source: str | None = None) -> bool:
    """Replace every hub id among `plan`'s model paths by its local folder (see `model_folder`); True when
    any was replaced. HubError names the model."""
    changed = False
    for name, spec in plan["models"].items():
        try:
            folder = model_folder(spec["path"], fetch=fetch, source=source)
        except HubError as e:
            raise HubError(f"model {name!r}: {e}") from None
        changed |= folder != spec["path"]
        spec["path"] = folder
    return changed


def download_plan(plan: dict, echo) -> int:
    """Fetch every hub-id model of `plan` into the cache (`tokenrouter download`), a line per model through
    `echo`; returns how many were not to be had (each said through `echo` as an error)."""
    return sum(not _download_model(name, spec["path"], echo) for name, spec in plan["models"].items())


def _download_model(name: str, path: str, echo) -> bool:
    """One model of `download_plan`: whether it is here now (a local folder, cached, or fetched)."""
    if not is_hub_id(path) or Path(path).exists():
        echo(f"model {name!r}: local folder {path}")
        return True
    folder = cached(path)
    if folder is not None:
        echo(f"model {name!r}: {path} already cached at {folder}")
        return True
    if offline():
        echo(f"error: model {name!r}: '{path}' is not in the hub cache at {cache_dir()} and HF_HUB_OFFLINE "
             "is set (unset it to fetch)")  # fmt: skip
        return False
    echo(f"model {name!r}: fetching {path} into {cache_dir()}")
    try:
        folder = download(path)
    except HubError as e:
        echo(f"error: model {name!r}: {e}")
        return False
    echo(f"model {name!r}: {path} at {folder}")
    return True
