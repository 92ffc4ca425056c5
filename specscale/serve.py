"""`specscale serve`: build the pipeline, the engine loop and the app, bind the socket, run uvicorn.

The socket is bound before uvicorn starts, so `--port 0` serves on a free port; the line
`SpecScale serving <model> at http://HOST:PORT` on stdout says where (tests and scripts read it); the
lines before it say what memory each model holds (weights, KV pool) and the process's resident memory.
Checkpoints are read as safetensors, tokenizer.json and a sandboxed chat template: no code from a
checkpoint folder is ever imported or executed.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
from pathlib import Path

from specscale.checkpoint_source import is_hub_id, resolve_checkpoint
from specscale.config import KERNEL_MODES
from specscale.former_flag import add_former_name
from specscale.pipeline import PipelineConfig
from specscale.preset_argument import preset_argument
from specscale.scaleout.command import add_ray_flags
from specscale.search.presets import PRESETS
from specscale.server.settings import ServerSettings
from specscale.usage_error import UsageError
from specscale.verify.profile import DEFAULT_LV_THRESHOLD
from specscale.vllm_backend.engine_args import VllmBackendError
from specscale.vllm_backend.selection import add_backend_arguments, chosen_backends, stack_description

log = logging.getLogger("specscale.server")


class DefaultOnceHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """`-h` with each option's default once: appended to its help unless the help already says it (an
    option whose default is computed at start), and left out when there is none (None) or the flag is off."""

    def _get_help_string(self, action) -> str | None:
        if "default" in (action.help or "") or action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def add_serve(sub) -> None:
    defaults, limits = PipelineConfig(), ServerSettings()
    p = sub.add_parser("serve", help="serve searches over an OpenAI-compatible HTTP API",
                       formatter_class=DefaultOnceHelpFormatter)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed at startup)")
    p.add_argument("--generator", "--model", default=defaults.generator,
                   help="local Hugging Face folder, or a Hub id (owner/name, fetched into the HF cache)")
    p.add_argument("--prm", default=defaults.prm, help="local Hugging Face folder, or a Hub id")
    p.add_argument("--served-model-name", default=None, help="the API's model id (default: generator folder name)")
    p.add_argument("--api-key", default=os.environ.get("SPECSCALE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 (default: $SPECSCALE_API_KEY, else none; "
                        "an empty key is refused)")
    p.add_argument("--protect-metrics", action="store_true",
                   help="require the API key on /health and /metrics too (default: open, for probes)")
    p.add_argument("--trust-special-tokens", action="store_true",
                   help="read special-token text in message contents as control tokens (lets a caller forge "
                        "chat turns: trusted callers only; default: such text is plain text)")
    p.add_argument("--default-preset", default=limits.default_preset, type=preset_argument,
                   help=f"a preset or preset[field=value,...] (presets: {', '.join(sorted(PRESETS))})")
    p.add_argument("--max-concurrency", type=int, default=defaults.max_concurrency, help="searches running at once")
    p.add_argument("--max-waiting", type=int, default=limits.max_waiting,
                   help="accepted searches waiting for a slot; more are refused with 429")
    p.add_argument("--max-beam-size", type=int, default=limits.max_beam_size,
                   help="largest search.beam_size a request may ask for")
    p.add_argument("--request-timeout", type=float, default=limits.request_timeout_s, help="seconds per search")
    p.add_argument("--max-body-bytes", type=int, default=limits.max_body_bytes, help="largest request body")
    p.add_argument("--header-timeout", type=float, default=limits.header_timeout_s,
                   help="seconds a client may take to send a request's headers (then 408, connection closed)")
    p.add_argument("--body-timeout", type=float, default=limits.body_timeout_s,
                   help="seconds a client may take to send a request's body after its headers (then 408)")
    p.add_argument("--keep-alive-timeout", type=float, default=limits.keep_alive_s,
                   help="seconds an idle kept-alive connection stays open between requests (keep it above your "
                        "clients' pool expiry: httpx and openai 5 s)")
    p.add_argument("--max-connections", type=int, default=limits.max_connections,
                   help="open connections; one more gets 503 and is closed")
    p.add_argument("--drain-timeout", type=float, default=None,
                   help="on SIGTERM / Ctrl-C, seconds to let accepted searches finish while new ones get 503 "
                        "(default: --request-timeout + 5)")
    p.add_argument("--system-prompt", default=defaults.system_prompt,
                   help="put first in chats without a system message")
    kv_gb = p.add_argument("--kv-gb", dest="generator_kv_gb", type=float, default=defaults.generator_kv_gb,
                           help="generator KV pool, GB")
    add_former_name(p, "--generator-kv-gb", kv_gb)
    p.add_argument("--prm-kv-gb", type=float, default=defaults.prm_kv_gb, help="PRM KV pool, GB")
    lv_threshold = p.add_argument("--lv-threshold", dest="lv_threshold_tokens", type=int, default=None,
                                  help="lazy-verification threshold in PRM tokens (default: the PRM's profile on this "
                                       "device, measured at the first start; else the cost model's knee, else "
                                       f"{DEFAULT_LV_THRESHOLD})")
    add_former_name(p, "--lv-threshold-tokens", lv_threshold)
    p.add_argument("--profile-prm", action=argparse.BooleanOptionalAction, default=True,
                   help="profile a PRM never profiled on this device at start (default); --no-profile-prm: its "
                        "LV threshold is then the device cost model's knee")
    p.add_argument("--device", default=defaults.device, help="cpu or cuda")
    p.add_argument("--kernels", default="auto", choices=KERNEL_MODES, help="CPU linear kernels: auto (the fastest measured on this machine), or force ours / onednn / transposed / torch")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--access-log", action="store_true", help="log every HTTP request")
    add_ray_flags(p)
    add_backend_arguments(p)  # --backend engine|vllm, --generator-backend, --verifier-backend, --vllm-arg
    p.set_defaults(func=run_serve)


def run_serve(args) -> int:
    problem = _argument_problem(args)
    if problem is not None:
        print(f"specscale serve: {problem}")
        return 2
    try:
        resolve_hub_ids(args)
    except UsageError as error:
        print(f"specscale serve: {error}")
        return 2
    for name, folder in (("generator", args.generator), ("prm", args.prm)):
        if not (Path(folder) / "config.json").is_file():
            print(f"specscale serve: no checkpoint at {folder} (--{name}); pass a local Hugging Face folder")
            return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s:     %(name)s: %(message)s")
    try:
        args.stack_description = stack_description(args, pipeline_config(args))  # vLLM's checks, nothing loaded
    except VllmBackendError as error:
        print(f"specscale serve: {error}")
        return 2
    if args.ray and chosen_backends(args) != ("engine", "engine"):
        print("specscale serve: --ray serves our engine only; --backend vllm runs without it (docs/gpu.md)")
        return 2
    if args.ray:  # docs/scale-out.md
        from specscale.scaleout.command import run_ray_serve, scale_out_config

        return run_ray_serve(args, scale_out_config(args, pipeline_config(args), server_settings(args)))
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    app = build_server(args)
    sock = bind(args.host, args.port)
    host, port = sock.getsockname()[:2]
    print(f"SpecScale serving {_served_name(args)} at http://{_url_host(host)}:{port}", flush=True)
    from specscale.server.connection import uvicorn_config
    from specscale.server.draining_server import DrainingServer

    settings, engine_loop = app.state.settings, app.state.engine_loop
    config = uvicorn_config(app, settings, app.state.metrics, log_level=args.log_level, access_log=args.access_log,
                            timeout_graceful_shutdown=5)
    server = DrainingServer(config, engine_loop, settings.drain_s)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C before uvicorn took over the signals
        server.run(sockets=[sock])
    if server.drained_in_time is not None and engine_loop.left_at_stop is not None:
        print(f"SpecScale drained ({'every search finished' if server.drained_in_time else 'drain timeout'}): "
              f"{engine_loop.left_at_stop.describe()}", flush=True)
    print("SpecScale stopped", flush=True)
    return 0


def resolve_hub_ids(args) -> None:
    """A Hugging Face Hub id in --generator / --prm becomes its cached snapshot folder; the API's model id stays
    the generator's Hub id unless --served-model-name says otherwise."""
    if is_hub_id(args.generator) and args.served_model_name is None:
        args.served_model_name = args.generator
    args.generator = resolve_checkpoint("--generator", args.generator)
    args.prm = resolve_checkpoint("--prm", args.prm)


def build_server(args):
    """The app for these arguments: loads both models (the slow part)."""
    from specscale.server.app import build_app
    from specscale.server.serving_process import ServingProcess

    try:
        process = ServingProcess.build(pipeline_config(args), server_settings(args),
                                       description=getattr(args, "stack_description", None))
    except VllmBackendError as error:  # vLLM cannot run the model, a bad engine argument
        raise SystemExit(f"specscale serve: {error}") from None
    log_memory(process.stack)
    return build_app(process.engine_loop, process.builder, process.metrics, process.settings,
                     on_shutdown=process.stack.close)


def pipeline_config(args) -> PipelineConfig:
    return PipelineConfig(
        generator=args.generator, prm=args.prm, device=args.device, generator_kv_gb=args.generator_kv_gb,
        prm_kv_gb=args.prm_kv_gb, max_concurrency=args.max_concurrency, lv_threshold_tokens=args.lv_threshold_tokens,
        system_prompt=args.system_prompt, seed=args.seed, trust_special_tokens=args.trust_special_tokens,
        kernels=args.kernels, profile_prm=args.profile_prm,
    )


def server_settings(args) -> ServerSettings:
    return ServerSettings(
        served_model_name=_served_name(args), default_preset=args.default_preset, max_waiting=args.max_waiting,
        max_beam_size=args.max_beam_size, request_timeout_s=args.request_timeout, max_body_bytes=args.max_body_bytes,
        api_key=args.api_key, protect_metrics=args.protect_metrics, trust_special_tokens=args.trust_special_tokens,
        header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout, keep_alive_s=args.keep_alive_timeout,
        max_connections=args.max_connections,
        drain_timeout_s=args.drain_timeout,
    )


def _argument_problem(args) -> str | None:
    """What is wrong with the arguments before any model loads, or None."""
    if args.api_key is not None and not args.api_key.strip():
        return ("--api-key (or $SPECSCALE_API_KEY) is empty, which would serve without authentication; "
                "pass a key or leave both unset")
    if args.protect_metrics and args.api_key is None:
        return "--protect-metrics needs --api-key"
    if args.verifier_replicas and not args.ray:
        return "--verifier-replicas needs --ray (PRM replicas are a Ray Serve deployment: docs/scale-out.md)"
    return None


def log_memory(pipeline) -> None:
    """Start-up lines on stdout (whatever the log level): what each model holds, the process's resident memory."""
    from specscale.model.kernel_choice import describe_paths
    from specscale.model.memory import MIB, process_resident_bytes
    from specscale.vllm_backend.stack import VllmStack

    if isinstance(pipeline, VllmStack):  # vLLM reports its own memory in its log
        print(f"SpecScale backends: {pipeline.describe()}", flush=True)
        print(f"SpecScale process resident memory: {process_resident_bytes() / MIB:,.0f} MiB", flush=True)
        return
    print(f"SpecScale generator memory: {pipeline.engine.model_memory().describe()}", flush=True)
    print(f"SpecScale PRM memory: {pipeline.verifier.engine.model_memory().describe()}", flush=True)
    for role, engine in (("generator", pipeline.engine), ("PRM", pipeline.verifier.engine)):
        report = engine.kernels()
        print(f"SpecScale {role} {describe_paths(report)} on {report.get('machine', 'this device')}", flush=True)
    print(f"SpecScale process resident memory: {process_resident_bytes() / MIB:,.0f} MiB", flush=True)


def bind(host: str, port: int) -> socket.socket:
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.create_server((host, port), family=family, backlog=2048)
    sock.set_inheritable(True)
    return sock


def _served_name(args) -> str:
    return args.served_model_name or Path(args.generator).resolve().name


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
