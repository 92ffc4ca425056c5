"""Where a model argument's checkpoint is: a local Hugging Face folder, or a Hugging Face Hub repository id.

`--generator` / `--prm` take a folder holding `config.json`. A name that is no local path and reads as a Hub
repository id (`owner/name`, e.g. `Qwen/Qwen2.5-7B-Instruct`) is read from the Hugging Face cache, or fetched into
it first (config, tokenizer and safetensors files only) with `huggingface_hub`, which transformers depends on.
Either engine, ours or vLLM, then loads the local snapshot folder, so both read the same files. With
`HF_HUB_OFFLINE=1` the cache alone is read. Anything that fails is one line naming the argument (`UsageError`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from specscale.usage_error import UsageError

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")  # owner/name
CHECKPOINT_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]  # no .bin, no .pt


def is_hub_id(name: str) -> bool:
    """`owner/name` that is not a path on this machine."""
    return bool(REPO_ID.match(name)) and not Path(name).exists()


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def resolve_checkpoint(flag: str, name: str) -> str:
    """The local folder for `name`: `name` itself unless it is a Hub repository id, else its snapshot folder in
    the Hugging Face cache (fetched on first use unless offline)."""
    if not is_hub_id(name):
        return name
    from huggingface_hub import snapshot_download

    try:
        return str(snapshot_download(name, allow_patterns=CHECKPOINT_FILES, local_files_only=True))
    except Exception as cached_error:  # huggingface_hub raises LocalEntryNotFoundError and others: not cached
        if hub_offline():
            raise UsageError(f"{flag} {name}: no local folder of that name, and HF_HUB_OFFLINE is set while the "
                             f"Hugging Face cache holds no snapshot of it ({type(cached_error).__name__})") from None
    print(f"fetching {name} from the Hugging Face Hub into its cache (config, tokenizer, safetensors)", flush=True)
    try:
        return str(snapshot_download(name, allow_patterns=CHECKPOINT_FILES))
    except Exception as error:  # not found, gated, no network: the Hub's own exception types, one line each
        raise UsageError(f"{flag} {name}: no local folder of that name, and the Hugging Face Hub did not give it "
                         f"({type(error).__name__}: {first_line(error)})") from None


def first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else "no message"
