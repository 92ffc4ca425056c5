"""A Hugging Face Hub id in --generator / --prm (`Qwen/Qwen2.5-7B-Instruct`, as GPU users name models) is read as its
snapshot folder in the Hugging Face cache (specscale/checkpoint_source.py). Nothing is downloaded here: the cache
is built in a temporary folder in the layout huggingface_hub writes (refs/main naming a snapshot), and the Hub is
switched off (HF_HUB_OFFLINE=1), so a repository the cache lacks fails in one line naming the flag."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from specscale.checkpoint_source import is_hub_id
from specscale.defaults import TOY_GENERATOR

SNAPSHOT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(tmp_path, repo_id: str):
    """A Hugging Face cache holding one snapshot of `repo_id`: the bundled toy generator's files."""
    repo = tmp_path / "hub" / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(SNAPSHOT)
    shutil.copytree(TOY_GENERATOR, repo / "snapshots" / SNAPSHOT)
    return tmp_path / "hub", repo / "snapshots" / SNAPSHOT


def offline_env(cache) -> dict:
    return {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}


def resolve_in_subprocess(cache, flag: str, name: str) -> subprocess.CompletedProcess:
    """huggingface_hub reads its cache folder and offline switch at import, so each case runs in a fresh process."""
    code = ("import sys; from specscale.checkpoint_source import resolve_checkpoint; from specscale.usage_error import "
            "UsageError\ntry: print(resolve_checkpoint(sys.argv[1], sys.argv[2]))\nexcept UsageError as e: "
            "print(e); sys.exit(2)")
    return subprocess.run([sys.executable, "-c", code, flag, name], env=offline_env(cache), capture_output=True,
                          text=True, timeout=120)


def test_a_cached_hub_id_resolves_to_its_snapshot_folder(tmp_path):
    cache, snapshot = hub_cache(tmp_path, "acme/toy-generator")
    done = resolve_in_subprocess(cache, "--generator", "acme/toy-generator")
    assert done.returncode == 0, done.stderr
    assert os.path.samefile(done.stdout.strip(), snapshot)
    assert (snapshot / "config.json").is_file()


def test_an_uncached_hub_id_offline_fails_in_one_line_naming_the_flag(tmp_path):
    cache, _ = hub_cache(tmp_path, "acme/toy-generator")
    done = resolve_in_subprocess(cache, "--prm", "acme/not-there")
    assert done.returncode == 2
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("--prm acme/not-there: ") and "HF_HUB_OFFLINE" in lines[0]


def test_local_paths_are_never_read_as_hub_ids(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "gen").mkdir()
    assert not is_hub_id("models/gen")  # exists here: a local folder
    assert is_hub_id("Qwen/Qwen2.5-7B-Instruct")
    assert not is_hub_id("/abs/path") and not is_hub_id("./rel/path") and not is_hub_id("a/b/c")
    assert not is_hub_id("just-a-name")


def test_serve_with_an_uncached_hub_id_exits_2_in_one_line(tmp_path):
    cache, _ = hub_cache(tmp_path, "acme/toy-generator")
    done = subprocess.run([sys.executable, "-m", "specscale.cli", "serve", "--model", "acme/missing", "--port", "0"],
                          env=offline_env(cache), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    out = (done.stdout + done.stderr).strip().splitlines()
    assert out == [out[0]] and out[0].startswith("specscale serve: --generator acme/missing: "), out
