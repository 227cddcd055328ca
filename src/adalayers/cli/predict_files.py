"""`adalayers predict-files`: every side task over CSV/TSV/JSON Lines/Parquet files, one base pass per batch."""
from __future__ import annotations

import json

from adalayers.cli.common import add_runtime_arg


def cmd_predict_files(args) -> int:
    from adalayers.bulk.local import Job
    from adalayers.infer.sidetasks import heads_base

    job = Job(base=args.base or "", heads=list(args.heads), input=args.input, id_column=args.id_column,
              text_column=args.text_column, text_pair_column=args.text_pair_column, output_format=args.format, part_rows=args.part_rows,
              max_length=args.max_length, skip_bad_rows=args.skip_bad_rows, runtime=args.runtime)
    job.base = job.base or heads_base(job.specs)  # the heads parsed once, here; the job keeps them
    if args.engine == "ray":
        from adalayers.bulk import ray_engine

        manifest = ray_engine.run(job, args.output, batch_size=args.batch_size, concurrency=args.concurrency,
                                  num_gpus=args.num_gpus, cpus_per_actor=args.cpus_per_actor, address=args.address,
                                  num_cpus=args.num_cpus, device=args.device, num_threads=args.threads or 1)
    else:
        import torch

        from adalayers.bulk import local

        if args.threads:
            torch.set_num_threads(args.threads)
        manifest = local.run(job, args.output, batch_size=args.batch_size, device=args.device, num_threads=args.threads)
    print(json.dumps({"output": str(args.output), "rows_read": manifest.get("rows_read"),
                      "rows": manifest["rows"], "parts": len(manifest["parts"]),
                      "bad_rows": manifest.get("bad_rows", 0), "seconds": manifest.get("seconds_last_run")}))
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("predict-files", help="run every head over CSV/TSV/JSONL/Parquet files into Parquet parts "
                                             "(resumable; --engine ray for Ray Data)")
    p.add_argument("--base", default=None, help="the frozen base the heads were trained on (default: the one "
                                                   "their run folders name, when they all name the same one)")
    p.add_argument("--heads", nargs="+", required=True, metavar="RUN",
                   help="run folders (or NAME=RUN_FOLDER); the name prefixes the task's output columns")
    p.add_argument("--input", required=True, metavar="PATH",
                   help="a .csv/.tsv/.jsonl/.parquet file, a folder of them, or a glob pattern (quoted)")
    p.add_argument("--output", required=True, metavar="FOLDER",
                   help="folder for part-NNNNN.parquet files and manifest.json; a rerun resumes it")
    p.add_argument("--id-column", default="id", help="input column copied to the output's id column")
    p.add_argument("--text-column", default="text", help="input column holding the text")
    p.add_argument("--text-pair-column", "--pair-column", default=None, metavar="COLUMN",
                   help="input column holding each row's second text, for heads trained on sentence pairs "
                        "(every head of the job must then take pairs)")
    p.add_argument("--format", default="parquet", choices=["parquet", "jsonl"], help="output file format")
    p.add_argument("--part-rows", type=int, default=10_000, help="rows per output part (the unit of resuming)")
    p.add_argument("--batch-size", type=int, default=32, help="texts per base pass")
    p.add_argument("--max-length", type=int, default=None, help="tokens per text (default: the heads' max_length)")
    p.add_argument("--skip-bad-rows", action="store_true",
                   help="skip rows without id or text (and malformed lines), counting them in the manifest; "
                        "without it the first one stops the job with its file and line")
    p.add_argument("--device", default="cpu", help="cpu, cuda, or auto")
    add_runtime_arg(p, trains=True)  # the runtimes that run a base alone (adalayers.runtimes)
    p.add_argument("--threads", type=int, default=None, help="CPU threads of torch and of the llama.cpp engine (per actor with --engine ray: 1)")
    p.add_argument("--engine", default="local", choices=["local", "ray"],
                   help="local: this process, resumable parts; ray: Ray Data actors (pip install 'adalayers[ray]')")
    g = p.add_argument_group("--engine ray")
    g.add_argument("--address", default=None, help="join this Ray cluster (default: start a local Ray on 127.0.0.1)")
    g.add_argument("--concurrency", type=int, default=2, help="actors, each with its own base and heads")
    g.add_argument("--num-gpus", type=float, default=0, help="GPUs per actor")
    g.add_argument("--cpus-per-actor", type=float, default=0.5,
                   help="logical CPUs each actor reserves (the rest read and write)")
    g.add_argument("--num-cpus", type=int, default=2, help="logical CPUs of the local Ray (without --address)")
    p.set_defaults(fn=cmd_predict_files)
