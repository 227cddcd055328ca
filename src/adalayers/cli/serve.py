"""`adalayers serve`: load a base and its heads, then run the HTTP app under uvicorn (or Ray Serve).

The service's settings are ServeConfig's fields (serve/config.py); each is one flag here, built from
the field (name, type, default, help): a new setting is one new field.
"""
from __future__ import annotations

import logging
import typing

from adalayers.cli.common import add_runtime_arg
from adalayers.serve.config import ServeConfig, serve_flag, serve_metavar

log = logging.getLogger(__name__)


def _flag_type(annotation):
    """What argparse converts a flag's text to: int | None -> int, Literal['auto', 'cpu'] -> str."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        return type(args[0])
    return _flag_type(args[0]) if args else annotation


def add_setting_flags(p) -> None:
    """One flag per ServeConfig field, its value stored under the field's name: a bool is a switch
    (--no-NAME turns off one that is on by default), anything else takes a value of the field's type."""
    for name, field in ServeConfig.model_fields.items():
        flags = [serve_flag(name), *(field.json_schema_extra or {}).get("aliases", [])]
        if field.annotation is bool:
            p.add_argument(*flags, dest=name, action="store_false" if field.default else "store_true",
                           help=ServeConfig.help(name))
        else:
            p.add_argument(*flags, dest=name, type=_flag_type(field.annotation), default=field.default,
                           metavar=serve_metavar(name), help=ServeConfig.help(name),
                           action=(field.json_schema_extra or {}).get("action", "store"))  # append: repeatable


def _loader(args, cfg: ServeConfig):
    """What `serve` loads: on llama.cpp the torch-free GgufPredictor (infer/gguf_serving.py: numpy heads, llama.cpp's
    tokenizer; neither torch nor transformers enters the process), on every other runtime SideTasks."""
    from adalayers.store.head_spec import parse_heads

    heads = parse_heads(args.heads, "--heads")
    # without heads a prompt may fill the context; with them, the heads' model.max_length (or --max-length)
    sizes = {"max_length": cfg.max_length or (None if args.heads else cfg.ctx_size), "batch_size": cfg.max_batch,
             "threads": cfg.num_threads, "ctx_size": cfg.ctx_size, "parallel": cfg.parallel}
    if args.runtime == "llama.cpp":
        from adalayers.infer.gguf_serving import GgufPredictor
        from adalayers.infer.heads import heads_base

        return lambda: GgufPredictor.load(args.base or heads_base(heads), heads, primary=cfg.primary, **sizes)
    import torch

    from adalayers.infer.sidetasks import SideTasks

    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    return lambda: SideTasks.load(args.base, heads, primary=cfg.primary, device=cfg.device, runtime=args.runtime,
                                  **sizes)


def cmd_serve(args) -> int:
    import uvicorn

    from adalayers.errors import ConfigError
    from adalayers.serve.app import Loading, create_app
    from adalayers.serve.auth import read_api_key
    from adalayers.serve.limits import timed_h11

    cfg = ServeConfig(**{name: getattr(args, name) for name in ServeConfig.model_fields})
    # ServeConfig validates every value (pydantic): a bad one is a ConfigError naming its flag
    if not args.heads and not args.base:
        raise ConfigError("name the model to serve: --base BASE (and --heads RUN ... for side tasks)")
    api_key = cfg.api_key or read_api_key(cfg.api_key_file)
    if not api_key and cfg.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s without an API key: anyone who can reach it can use it "
                    "(give --api-key-file, or put it behind a proxy that authenticates)", cfg.host)
    if args.engine == "ray":
        return _serve_on_ray(args, cfg)

    load = _loader(args, cfg)

    def ready(side) -> None:
        print(f"serving {', '.join(side.names) or 'no side tasks'} on {side.backbone.name} (fingerprint "
              f"{side.backbone.fingerprint()}) at http://{cfg.host}:{cfg.port}  (docs: /docs"
              f"{', playground: /' if cfg.ui else ''})", flush=True)

    def failed(error: BaseException) -> None:
        server.should_exit = True  # the error is raised below, once the server has stopped

    app = Loading(load, lambda side: create_app(side, cfg, api_key), ready, failed)
    server = uvicorn.Server(uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=args.log_level,
                                           http=timed_h11(cfg.read_timeout_s), timeout_keep_alive=cfg.keep_alive_s,
                                           h11_max_incomplete_event_size=16 * 1024))  # request line + headers: 16 KiB
    what = args.base or "the heads' base"
    print(f"loading {what} for http://{cfg.host}:{cfg.port} (GET /health: 503 until it is ready, then 200)",
          flush=True)
    server.run()
    if app.error is not None:
        raise app.error
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
                              args.address, runtime=args.runtime)
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
    p.add_argument("--heads", nargs="*", default=[], metavar="RUN",
                   help="run folders (or NAME=RUN_FOLDER to name a task); the folder name is the task name "
                        "(none: a plain OpenAI-style server of the base, --base then required)")
    add_setting_flags(p)  # --host, --port, --max-batch, ... --no-ui: ServeConfig's fields
    add_runtime_arg(p, backend_alias=True)  # every runtime of adalayers.runtimes; --backend: its old name
    p.add_argument("--log-level", default="warning", help="uvicorn's log level (info logs every request)")
    p.add_argument("--engine", default="uvicorn", choices=["uvicorn", "ray"],
                   help="uvicorn: one process; ray: Ray Serve replicas (pip install 'adalayers[ray]')")
    p.add_argument("--replicas", type=int, default=1, help="--engine ray: replicas, each with its own base and heads")
    p.add_argument("--min-replicas", type=int, default=None, help="--engine ray: autoscale from this many ...")
    p.add_argument("--max-replicas", type=int, default=None, help="... to this many replicas")
    p.add_argument("--address", default=None, help="--engine ray: join this Ray cluster (default: a local Ray)")
    p.set_defaults(fn=cmd_serve)
