"""`adalayers serve`: load a base and its heads, then run the HTTP app under uvicorn."""
from __future__ import annotations

import logging

from adalayers.serve.config import ServeConfig


log = logging.getLogger(__name__)


def _help(name: str) -> str:
    return ServeConfig.help(name)


def _default(name: str):
    return ServeConfig.model_fields[name].default


def cmd_serve(args) -> int:
    import torch
    import uvicorn

    from adalayers.infer.sidetasks import SideTasks
    from adalayers.serve.app import create_app
    from adalayers.serve.auth import read_api_key
    from adalayers.serve.limits import timed_h11

    cfg = ServeConfig(host=args.host, port=args.port, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                      max_texts=args.max_texts, max_chars=args.max_chars, max_length=args.max_length,
                      primary=not args.no_primary, device=args.device, num_threads=args.threads,
                      max_tokens=args.max_tokens, max_batch_tokens=args.max_batch_tokens, max_queue=args.max_queue,
                      request_timeout_s=args.request_timeout, read_timeout_s=args.read_timeout,
                      keep_alive_s=args.keep_alive, api_key_file=args.api_key_file,
                      chat_template=args.chat_template, continuous_batching=not args.no_continuous_batching,
                      ui=not args.no_ui)
    # ServeConfig validates every value (pydantic): a bad one is a ConfigError naming its flag
    api_key = read_api_key(cfg.api_key_file)
    if not api_key and cfg.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s without an API key: anyone who can reach it can use it "
                    "(give --api-key-file, or put it behind a proxy that authenticates)", cfg.host)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    if args.engine == "ray":
        return _serve_on_ray(args, cfg)
    side = SideTasks.load(args.base, args.heads, primary=cfg.primary, device=cfg.device,
                          max_length=cfg.max_length, batch_size=cfg.max_batch, backend=args.backend)
    print(f"serving {', '.join(side.names)} on {side.backbone.name} (fingerprint {side.backbone.fingerprint()}) "
          f"at http://{cfg.host}:{cfg.port}  (docs: /docs{', playground: /' if cfg.ui else ''})", flush=True)
    uvicorn.run(create_app(side, cfg, api_key), host=cfg.host, port=cfg.port, log_level=args.log_level,
                http=timed_h11(cfg.read_timeout_s), timeout_keep_alive=cfg.keep_alive_s,
                h11_max_incomplete_event_size=16 * 1024)  # request line + headers: 16 KiB at most
    return 0


def _serve_on_ray(args, cfg: ServeConfig) -> int:
    """The same app on Ray Serve (serve/ray_serve.py); runs until SIGINT/SIGTERM, then shuts Serve down."""
    import signal
    import threading

    from adalayers.errors import ConfigError
    from adalayers.raylocal import import_ray

    import_ray(local=not args.address)  # before Ray Serve's import: a local Ray on 127.0.0.1 only
    from adalayers.serve import ray_serve

    if args.replicas < 1:
        raise ConfigError(f"--replicas: must be at least 1, got {args.replicas}")
    stop = threading.Event()
    try:
        url = ray_serve.start(args.base, args.heads, cfg, args.replicas, args.min_replicas, args.max_replicas,
                              args.address)
        for sig in (signal.SIGINT, signal.SIGTERM):  # after Ray's start, which may install handlers of its own
            signal.signal(sig, lambda *_: stop.set())
        print(f"serving on Ray Serve at {url}  (docs: /docs; Ctrl-C or SIGTERM stops it)", flush=True)
        stop.wait()
    finally:
        ray_serve.stop()
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("serve", help="serve trained heads over HTTP, all answered from one pass of the base")
    p.add_argument("--base", default=None,
                   help="the frozen base the heads were trained on: an alias, a model folder or a hub id "
                        "(default: the base the heads' run folders name, when they all name the same one)")
    p.add_argument("--heads", nargs="+", required=True, metavar="RUN",
                   help="run folders (or NAME=RUN_FOLDER to name a task); the folder name is the task name")
    p.add_argument("--host", default=_default("host"), help=_help("host"))
    p.add_argument("--port", type=int, default=_default("port"), help=_help("port"))
    p.add_argument("--max-batch", type=int, default=_default("max_batch"), help=_help("max_batch"))
    p.add_argument("--max-wait-ms", type=float, default=_default("max_wait_ms"), help=_help("max_wait_ms"))
    p.add_argument("--max-texts", type=int, default=_default("max_texts"), help=_help("max_texts"))
    p.add_argument("--max-chars", type=int, default=_default("max_chars"), help=_help("max_chars"))
    p.add_argument("--max-length", type=int, default=None, help=_help("max_length"))
    p.add_argument("--no-primary", action="store_true",
                   help="stop the base after the deepest layer any head uses (early exit); answers then carry "
                        "no base output (default: off, the base runs to its end)")
    p.add_argument("--device", default=_default("device"), help=_help("device"))
    p.add_argument("--threads", type=int, default=None, help=_help("num_threads"))
    p.add_argument("--backend", "--runtime", default="torch", choices=["torch", "onnx", "onnx-int8", "llama.cpp"],
                   help="torch: the PyTorch pass; onnx / onnx-int8: one exported graph in ONNX Runtime (--base may "
                        "then be a folder from 'adalayers export'; see docs/export.md); llama.cpp: a GGUF base run "
                        "quantized by llama.cpp (docs/llm.md)")
    p.add_argument("--max-tokens", type=int, default=_default("max_tokens"), help=_help("max_tokens"))
    p.add_argument("--max-batch-tokens", type=int, default=_default("max_batch_tokens"), help=_help("max_batch_tokens"))
    p.add_argument("--max-queue", type=int, default=_default("max_queue"), help=_help("max_queue"))
    p.add_argument("--request-timeout", type=float, default=_default("request_timeout_s"), metavar="SECONDS",
                   help=_help("request_timeout_s"))
    p.add_argument("--read-timeout", type=float, default=_default("read_timeout_s"), metavar="SECONDS",
                   help=_help("read_timeout_s"))
    p.add_argument("--keep-alive", type=int, default=_default("keep_alive_s"), metavar="SECONDS",
                   help=_help("keep_alive_s"))
    p.add_argument("--api-key-file", default=None, metavar="FILE", help=_help("api_key_file"))
    p.add_argument("--no-ui", action="store_true",
                   help="leave out the playground page at GET / (default: served; see docs/serving.md)")
    p.add_argument("--no-continuous-batching", action="store_true",
                   help="each generation on the /v1 routes decodes alone, taking turns between steps (default: "
                        "they share decode steps, a new request joining between two)")
    p.add_argument("--chat-template", default=None, metavar="FILE", help=_help("chat_template"))
    p.add_argument("--log-level", default="warning", help="uvicorn's log level (info logs every request)")
    p.add_argument("--engine", default="uvicorn", choices=["uvicorn", "ray"],
                   help="uvicorn: one process; ray: Ray Serve replicas (pip install 'adalayers[ray]')")
    p.add_argument("--replicas", type=int, default=1, help="--engine ray: replicas, each with its own base and heads")
    p.add_argument("--min-replicas", type=int, default=None, help="--engine ray: autoscale from this many ...")
    p.add_argument("--max-replicas", type=int, default=None, help="... to this many replicas")
    p.add_argument("--address", default=None, help="--engine ray: join this Ray cluster (default: a local Ray)")
    p.set_defaults(fn=cmd_serve)
