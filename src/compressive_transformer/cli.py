"""``compressive-transformer``: thin subcommands over :mod:`compressive_transformer.run`.

Mistakes a user can make (a missing file, an unknown key, a run that already exists, a diverged loss) end as one
``error: ...`` line on stderr with exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from compressive_transformer.agents import command as rl_command
from compressive_transformer.config import ConfigError
from compressive_transformer.data.formats import path_formats

EXIT_USER_ERROR = 2


def _add_overrides(p: argparse.ArgumentParser, help_text: str) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE", help=help_text)


def _add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        default="auto",
        help="where the model runs: auto (CUDA if present, else CPU), cpu, cuda (default auto; wherever the run was trained)",
    )
    p.add_argument("--threads", type=int, help="CPU threads (default: the run's train.num_threads)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compressive-transformer",
        description="Train, evaluate and sample Compressive Transformers, Transformer-XL and Transformer-QL.",
    )
    from compressive_transformer import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        help="run `compressive-transformer COMMAND -h` for its options",
    )

    p = sub.add_parser(
        "train", help="train a model (or resume a run)", description="Train a model into a run directory."
    )
    p.add_argument("--config", type=Path, help="TOML config (see configs/); default: the built-in tiny config")
    _add_overrides(p, "override one config key, e.g. --set train.steps=500 (repeatable)")
    p.add_argument("--run-dir", type=Path, help="run directory; default: a fresh runs/<config>-<time>")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its newest checkpoint")

    p = sub.add_parser(
        "evaluate",
        help="score a split, your own text files or another corpus with a trained run",
        description="Streaming evaluation with memory carried through each document: loss in nats per token, bits per "
        "token, bits per character and byte of the text, word perplexity (word and subword tokenizers). A split "
        "writes RUN_DIR/eval_<split>.json; --text and --data write RUN_DIR/eval_text-<name>.json / "
        "eval_data-<format>-<dir>-<split>.json under a name no earlier result holds.",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="run directory written by `train`")
    p.add_argument(
        "--split", choices=("train", "validation", "test"), help="split to evaluate (default: eval.split of the run)"
    )
    p.add_argument(
        "--text",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="score these files (each one whole, memory carried through it) with the run's tokenizer",
    )
    p.add_argument("--data", type=Path, metavar="DIR", help="score a split of another corpus (with --format)")
    p.add_argument("--format", choices=path_formats(), help="the corpus format of --data")
    _add_overrides(p, "override an eval key, e.g. --set eval.mem_len=1024 (repeatable)")
    p.add_argument(
        "--checkpoint", type=Path, help="checkpoint directory to evaluate (default: the newest that verifies)"
    )
    p.add_argument(
        "--out",
        type=Path,
        help="where to write the result JSON (default: in RUN_DIR, under a name no earlier result holds)",
    )
    _add_device(p)

    p = sub.add_parser(
        "generate",
        help="sample continuations of prompts, streamed as they are produced",
        description="Sample text from a trained run, carrying memory across the prompt and the continuation. The text "
        "is printed as it is produced; --save-memory/--load-memory continue a long document across calls.",
    )
    p.add_argument(
        "run_dir",
        type=Path,
        metavar="RUN_DIR",
        help="run directory written by `train` (or a directory written by `export`)",
    )
    p.add_argument("--prompt", help="text to continue")
    p.add_argument(
        "--prompts-file",
        type=Path,
        help="one prompt per line (\\n inside a line is a newline); each is continued in turn",
    )
    p.add_argument("--max-tokens", type=int, default=200, help="tokens to generate (default 200)")
    p.add_argument("--temperature", type=float, default=1.0, help="softmax temperature; 0 is greedy (default 1.0)")
    p.add_argument(
        "--top-k", type=int, default=0, help="sample among the K most likely tokens; 0 keeps all (default 0)"
    )
    p.add_argument(
        "--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]; 1 keeps all (default 1.0)"
    )
    p.add_argument("--seed", type=int, help="random seed for reproducible samples")
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="STRING",
        help="end the continuation before this string (repeatable)",
    )
    p.add_argument("--mem-len", type=int, help="memory slots per layer (default: the run's eval/training value)")
    p.add_argument(
        "--cmem-len", type=int, help="compressed memory slots per layer (default: the run's eval/training value)"
    )
    p.add_argument(
        "--save-memory",
        type=Path,
        metavar="FILE",
        help="write the memory after the continuation to FILE (safetensors) to go on later",
    )
    p.add_argument(
        "--load-memory",
        type=Path,
        metavar="FILE",
        help="continue from a memory saved with --save-memory (the prompt may then be omitted)",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the decoding step: ~15 s to start, then about twice as fast per token",
    )
    _add_device(p)

    p = sub.add_parser(
        "export",
        help="write a run as a Hugging Face-style directory",
        description="Write OUT_DIR/config.json, model.safetensors and tokenizer.json; load it back with "
        "compressive_transformer.from_pretrained(OUT_DIR). OUT_DIR must be new or empty.",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="run directory written by `train`")
    p.add_argument("out_dir", type=Path, metavar="OUT_DIR", help="directory to write (new or empty)")
    p.add_argument("--checkpoint", type=Path, help="checkpoint directory to export (default: the newest)")

    p = sub.add_parser(
        "range",
        help="print the temporal range and attention cost of a config",
        description="Temporal range l x (n_m + c n_cm) and attention cost of a model config.",
    )
    p.add_argument("--config", type=Path, help="TOML config; default: the built-in tiny config")
    _add_overrides(p, "override one config key, e.g. --set model.cmem_len=512 (repeatable)")

    p = sub.add_parser(
        "compare",
        help="train several variants with one budget and tabulate them",
        description="Train every [variants.NAME] of a comparison spec (see configs/compare/) with the same budget, "
        "evaluate each, and write OUT/results.md and OUT/results.json (model, n_s/n_m/n_cm, window, average context "
        "length, bpc, perplexity, training tokens/s). Finished runs in OUT are reused, never overwritten.",
    )
    p.add_argument(
        "spec", type=Path, metavar="SPEC", help="comparison spec TOML with [base] and [variants.NAME] tables"
    )
    p.add_argument("--out", type=Path, help="output directory; default: a fresh runs/compare-<time>")
    _add_overrides(p, "override a key of every variant, e.g. --set train.steps=100 (repeatable)")
    p.add_argument("--split", choices=("train", "validation", "test"), help="split to evaluate (default: eval.split)")

    p = sub.add_parser(
        "study",
        help="train variants x seeds with one budget, measure them on whole books, report intervals",
        description="Train every [variants.NAME] of a study spec (see benchmarks/lm_study/study.toml) once per seed "
        "of [study] seeds with the same budget, measure each run on whole documents (bits per character, word "
        "perplexity, loss by how far back a word last occurred and by word frequency, attention by memory region) "
        "at its training memory and at every evaluations.NAME memory, and write OUT/results.md, OUT/results.json and "
        "plots with intervals over seeds and paired differences to the baseline. Resumable: rerun the same command "
        "after any interruption; finished runs are reused.",
    )
    p.add_argument(
        "spec", type=Path, metavar="SPEC", help="study spec TOML with [study], [base] and [variants.NAME] tables"
    )
    p.add_argument("--out", type=Path, help="output directory; default: the spec's directory")
    _add_overrides(p, "override a key of every variant, e.g. --set train.steps=100 (repeatable)")
    p.add_argument("--parallel", type=int, help="runs trained at once (default: study.parallel)")
    p.add_argument(
        "--threads",
        type=int,
        help="CPU threads in all, split between parallel runs (default: study.threads, else every core)",
    )

    p = sub.add_parser(
        "task",
        help="long-range synthetic tasks",
        description="Controlled long-range tasks (passkey, associative recall, selective copy), streamed segment by segment with memory.",
    )
    task_sub = p.add_subparsers(dest="task_command", required=True, metavar="ACTION", help="what to run")
    t = task_sub.add_parser(
        "long-range",
        help="train and score models by distance at equal attention cost",
        description="Train each model on each task, evaluate accuracy by distance, merge into OUT/results.json, and "
        "plot accuracy against distance with the theoretical ranges drawn in.",
    )
    t.add_argument(
        "--preset",
        choices=("quick", "full"),
        default="full",
        help="training budget and task sizes (quick: seconds; default full)",
    )
    t.add_argument(
        "--tasks",
        default="passkey",
        help="comma-separated: passkey, associative_recall, selective_copy (default passkey)",
    )
    t.add_argument(
        "--models",
        default="txl,ct",
        help="comma-separated: txl, ct, ct-<compression>-<loss>, or ablation for the compression fn x loss grid (default txl,ct)",
    )
    t.add_argument("--seed", type=int, default=0, help="seed of data and initialisation (default 0)")
    t.add_argument(
        "--seeds",
        help="comma-separated seeds, e.g. 0,1,2: every (task, model, seed) cell at one budget (--budget, else the preset's ablation budget), resumable, summarised with 95%% intervals in OUT/seeds.md",
    )
    t.add_argument("--parallel", type=int, default=1, help="cells trained at once with --seeds (default 1)")
    t.add_argument("--budget", type=int, help="training steps per model (default: the preset's)")
    t.add_argument("--out", type=Path, help="output directory (default: a fresh runs/long-range-<time>)")
    t.add_argument("--threads", type=int, help="torch CPU threads")
    t = task_sub.add_parser(
        "train",
        help="one model on one task from a TOML config",
        description="Train one model on one task (configs/long_range/) and write OUT/result.json with a plot.",
    )
    t.add_argument("config", type=Path, metavar="CONFIG", help="task TOML config")
    _add_overrides(t, "override a key, e.g. --set train.steps=200 (repeatable)")
    t.add_argument("--out", type=Path, required=True, help="output directory")

    for name, many in (("analyze", False), ("report", True)):
        p = sub.add_parser(
            name,
            help="the paper's analyses of one run" if not many else "a self-contained report comparing runs",
            description="Attention by memory region, compressibility per layer, temporal range (theoretical and "
            "measured), perplexity by word frequency and training curves, as markdown + HTML + PNG + JSON.",
        )
        p.add_argument(
            "run_dirs",
            type=Path,
            nargs="+" if many else 1,
            metavar="RUN_DIR",
            help="run directories written by `train`",
        )
        p.add_argument(
            "--out", type=Path, required=many, help="output directory" + ("" if many else " (default RUN_DIR/analysis)")
        )
        p.add_argument(
            "--split",
            choices=("train", "validation", "test"),
            default="validation",
            help="held-out split to analyse (default validation)",
        )
        p.add_argument("--only", help="comma-separated subset of regions, compressibility, temporal, frequency")
        p.add_argument("--max-segments", type=int, default=40, help="segments streamed per analysis (default 40)")
        p.add_argument("--batch-size", type=int, default=4, help="parallel streams (default 4)")
        _add_device(p)

    p = sub.add_parser("data", help="data utilities", description="Data utilities.")
    data_sub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION", help="what to do with the data")
    d = data_sub.add_parser(
        "download",
        help="download a benchmark corpus and verify its checksum",
        description="Download a benchmark corpus into DIR.",
    )
    from compressive_transformer.data import SOURCES

    d.add_argument("name", choices=sorted(SOURCES), help="corpus to download")
    d.add_argument(
        "dir",
        type=Path,
        metavar="DIR",
        nargs="?",
        default=Path("data"),
        help="directory to download into (default data, where the configs look)",
    )
    d.add_argument("--limit", type=int, help="pg19: only the first N books of each split")
    d.add_argument("--base-url", help="a mirror to download from instead of the corpus's own site")
    d.add_argument(
        "--manifest", type=Path, help="pg19: pinned manifest.json (from a previous download) every file must match"
    )

    p = sub.add_parser(
        "demo",
        help="train, evaluate and sample a small model on the pydoc topics in a few minutes",
        description="Train a small Compressive Transformer on Python's own help topics (bytes), evaluate it and sample from it.",
    )
    p.add_argument("--steps", type=int, help="training steps (default: the demo config's 400)")
    p.add_argument("--run-dir", type=Path, help="run directory; default: a fresh runs/demo-<time>")
    rl_command.add_arguments(sub.add_parser("rl", help="agents with a memory core (needs the [rl] extra)"))
    return parser


def cmd_train(args: argparse.Namespace) -> None:
    from compressive_transformer.distributed import DistInfo, shutdown
    from compressive_transformer.run import build_config, fresh_run_dir, train_run

    if args.resume:
        if args.run_dir is None:
            raise ConfigError("--resume: needs --run-dir, the run to continue")
        cfg = build_config(args.config, args.overrides) if args.config is not None else None
        summary = train_run(cfg, args.run_dir, resume=True, overrides=args.overrides)
        run_dir = args.run_dir
    else:
        cfg = build_config(args.config, args.overrides)
        run_dir = args.run_dir or fresh_run_dir(args.config.stem if args.config else "tiny")
        if args.run_dir is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ConfigError("--run-dir: name the run directory when several processes train one run (torchrun)")
        summary = train_run(cfg, run_dir)
    info = DistInfo(rank=int(os.environ.get("RANK", "0")), world_size=int(os.environ.get("WORLD_SIZE", "1")))
    shutdown(info)
    if not info.is_main:
        return
    if summary.validation is not None:
        print(summary.validation.summary())
    print(f"run directory: {run_dir} (step {summary.step}, checkpoint {summary.checkpoint})")


def cmd_evaluate(args: argparse.Namespace) -> None:
    if args.text is None and args.data is None:
        if args.format is not None:
            raise ConfigError("--format: applies to --data DIR only; add --data DIR or drop --format")
        from compressive_transformer.run import evaluate_run

        result = evaluate_run(
            args.run_dir,
            split=args.split,
            overrides=args.overrides,
            checkpoint=args.checkpoint,
            out=args.out,
            device=args.device,
            threads=args.threads,
        )
        print(result.summary())
        print(f"wrote {args.out or args.run_dir / f'eval_{result.split}.json'}")
        return
    from compressive_transformer.loading import load_run
    from compressive_transformer.text_eval import check_text_overrides, corpus_source, evaluate_source, files_source

    if args.text is not None and args.data is not None:
        raise ConfigError("--text and --data: give one of them")
    if args.data is not None and args.format is None:
        raise ConfigError(f"--data: needs --format ({', '.join(path_formats())})")
    if args.text is not None and args.format is not None:
        raise ConfigError("--format: applies to --data DIR only; drop it with --text")
    check_text_overrides(args.overrides, split=args.split, what="--text" if args.text is not None else "--data")
    run = load_run(
        args.run_dir, device=args.device, checkpoint=args.checkpoint, threads=args.threads, overrides=args.overrides
    )
    if args.text is not None:
        source = files_source(args.text, run.tokenizer.kind)
    else:
        source = corpus_source(run, args.data, args.format, args.split or run.config.eval.split)
    result, path = evaluate_source(run, source, out=args.out)
    print(result.summary())
    print(f"wrote {path}")


def cmd_generate(args: argparse.Namespace) -> None:
    from compressive_transformer.textgen import generate_command

    generate_command(args)


def cmd_export(args: argparse.Namespace) -> None:
    from compressive_transformer.export import export_run

    out = export_run(args.run_dir, args.out_dir, checkpoint=args.checkpoint)
    print(
        f"wrote {out} (config.json, model.safetensors, tokenizer.json); load it with compressive_transformer.from_pretrained"
    )


def cmd_range(args: argparse.Namespace) -> None:
    from compressive_transformer.context import range_report
    from compressive_transformer.run import build_config

    print(range_report(build_config(args.config, args.overrides).model))


def cmd_compare(args: argparse.Namespace) -> None:
    from compressive_transformer.experiments.compare import compare, results_table
    from compressive_transformer.run import fresh_run_dir

    out = args.out or fresh_run_dir("compare")
    rows = compare(args.spec, out, overrides=args.overrides, split=args.split)
    print(results_table(rows))
    print(f"wrote {out / 'results.md'} and {out / 'results.json'}")


def cmd_study(args: argparse.Namespace) -> None:
    from compressive_transformer.experiments.study import run_study

    out = args.out or args.spec.parent
    command = "compressive-transformer " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["study"] else ""
    summary = run_study(
        args.spec, out, overrides=args.overrides, parallel=args.parallel, threads=args.threads, command=command
    )
    print(
        f"{summary['runs_done']} of {summary['runs_total']} runs measured; wrote {out / 'results.md'} and {out / 'results.json'}"
    )


def cmd_task(args: argparse.Namespace) -> None:
    from compressive_transformer.experiments import run_long_range, run_task

    if args.task_command == "train":
        run_task(args.config, args.out, overrides=args.overrides)
        print(f"wrote {args.out / 'result.json'}")
        return
    if args.seeds is not None:
        from compressive_transformer.experiments.ablation import run_seeded, seeded_command

        try:
            seeds = tuple(int(s) for s in args.seeds.split(","))
        except ValueError:
            raise ConfigError(
                f"--seeds: {args.seeds!r} is not a comma-separated list of integers, e.g. 0,1,2"
            ) from None
        tasks, models = tuple(args.tasks.split(",")), tuple(args.models.split(","))
        command = seeded_command(args.preset, args.out, tasks, models, seeds, args.budget, args.parallel)
        run_seeded(
            args.preset,
            args.out,
            tasks=tasks,
            models=models,
            seeds=seeds,
            budget=args.budget,
            parallel=args.parallel,
            threads=args.threads or 1,
            command=command,
        )
        print(f"wrote {args.out / 'seeds.json'} and {args.out / 'seeds.md'}")
        return
    if args.parallel != 1:
        raise ConfigError("--parallel: only with --seeds (one seed runs its models one after another)")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from compressive_transformer.run import fresh_run_dir

    args.out = args.out or fresh_run_dir("long-range")
    run_long_range(
        args.preset,
        args.out,
        tasks=tuple(args.tasks.split(",")),
        models=tuple(args.models.split(",")),
        seed=args.seed,
        budget=args.budget,
    )
    print(f"wrote {args.out / 'results.json'} and {args.out / 'results.md'}")


def cmd_report(args: argparse.Namespace) -> None:
    from compressive_transformer.report import ANALYSES, write_report

    out = args.out or args.run_dirs[0] / "analysis"
    analyses = tuple(args.only.split(",")) if args.only else ANALYSES
    path = write_report(
        args.run_dirs,
        out,
        split=args.split,
        analyses=analyses,
        max_segments=args.max_segments,
        batch_size=args.batch_size,
        device=args.device,
        threads=args.threads,
    )
    print(f"wrote {path} (and report.html, PNGs, report.json beside it)")


def cmd_data(args: argparse.Namespace) -> None:
    from compressive_transformer.data import download

    path = download(args.name, args.dir, base_url=args.base_url, limit=args.limit, manifest=args.manifest)
    print(f"{args.name}: {path}")


def cmd_demo(args: argparse.Namespace) -> None:
    from compressive_transformer.run import demo

    result = demo(steps=args.steps, run_dir=args.run_dir)
    print()
    print(result.validation.summary())
    print("sample:")
    print(result.sample)
    print()
    print(f"finished in {result.seconds:.0f} s; run directory: {result.run_dir}")
    print(f"next: compressive-transformer generate {result.run_dir} --prompt 'def ' --temperature 0.8")


COMMANDS = {
    "train": cmd_train,
    "evaluate": cmd_evaluate,
    "generate": cmd_generate,
    "export": cmd_export,
    "range": cmd_range,
    "compare": cmd_compare,
    "study": cmd_study,
    "task": cmd_task,
    "analyze": cmd_report,
    "report": cmd_report,
    "data": cmd_data,
    "demo": cmd_demo,
    "rl": rl_command.main,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from compressive_transformer.allocator import keep_freed_memory
    from compressive_transformer.train import TrainingError

    keep_freed_memory()  # a process-wide allocator setting: the command line's to make, not the library's

    try:
        COMMANDS[args.command](args)
    except (ConfigError, TrainingError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as e:  # a full disk, a read-only directory, a permission: the message names the path
        print(f"error: {e}; the run's previous checkpoints are untouched", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("error: interrupted; continue the run with `train --run-dir DIR --resume`", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
