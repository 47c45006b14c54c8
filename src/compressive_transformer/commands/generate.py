"""``compressive-transformer generate``: sample continuations of prompts, printed as they are produced, carrying
memory across the prompt and the continuation (and, with memory files, across calls)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from compressive_transformer.commands import generate_audio
from compressive_transformer.commands.options import MAX_TOKENS, add_device, add_run_or_export, whole
from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.fileio import check_new
from compressive_transformer.inference.generate import SamplingConfig, check_sampling, clean_prompt
from compressive_transformer.inference.textgen import generate_text, load_memory, read_prompts, save_memory
from compressive_transformer.runs.loading import load_run

NAME = "generate"
HELP = "sample continuations of prompts, streamed as they are produced"
DESCRIPTION = (
    "Sample text from a trained run, carrying memory across the prompt and the continuation. The text "
    "is printed as it is produced; --save-memory/--load-memory continue a long document across calls."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_or_export(p)
    p.add_argument("--prompt", help="text to continue")
    p.add_argument(
        "--prompts-file",
        type=Path,
        help="one prompt per line (\\n inside a line is a newline); each is continued in turn",
    )
    p.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help=f"tokens to generate (default {MAX_TOKENS})")
    p.add_argument("--temperature", type=float, default=1.0, help="softmax temperature; 0 is greedy (default 1.0)")
    p.add_argument(
        "--top-k", type=int, default=0, help="sample among the K most likely tokens; 0 keeps all (default 0)"
    )
    p.add_argument(
        "--top-p",
        type=float,
        default=1.0,
        help="nucleus sampling mass in (0, 1]; 1 keeps all (default 1.0)",
    )
    p.add_argument("--seed", type=whole(0, 2**64 - 1), help="random seed for reproducible samples")
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="STRING",
        help="end the continuation before this string (repeatable)",
    )
    p.add_argument("--mem-len", type=whole(0), help="memory slots per layer (default: the run's eval/training value)")
    p.add_argument(
        "--cmem-len", type=whole(0), help="compressed memory slots per layer (default: the run's eval/training value)"
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
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.compile the decoding step: ~15 s to start, then about twice as fast per token "
        "(default: on a GPU, where the step is also replayed as a CUDA graph)",
    )
    add_device(p)
    generate_audio.add_arguments(p)


def main(args: argparse.Namespace) -> None:
    """Each prompt is printed, then its continuation as it is produced (an audio run writes a WAV file instead)."""
    if generate_audio.generate_command(args):
        return
    check_sampling(max_tokens=args.max_tokens)
    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    prompts = [clean_prompt(p) for p in _prompts(args)]
    if args.save_memory is not None and len(prompts) > 1:
        raise ConfigError("--save-memory: keeps the memory of one document; give one prompt")
    continued = args.save_memory is not None and args.save_memory == args.load_memory  # replacing is the point
    if args.save_memory is not None and not continued:
        check_new(args.save_memory, "--save-memory")  # only the --load-memory file may be replaced
    run = load_run(args.run_dir, device=args.device, threads=args.threads)
    memory = load_memory(args.load_memory, run) if args.load_memory is not None else None
    for i, prompt in enumerate(prompts):
        if i:
            sys.stdout.write("\n")
        sys.stdout.write(prompt)
        sys.stdout.flush()
        out = generate_text(
            run,
            prompt,
            max_tokens=args.max_tokens,
            sampling=sampling,
            seed=args.seed,
            compile=args.compile,
            mem_len=args.mem_len,
            cmem_len=args.cmem_len,
            stop=args.stop,
            stream=sys.stdout,
            memory=memory,
            return_memory=args.save_memory is not None,
        )
        sys.stdout.write("\n")
        sys.stdout.flush()
    if args.save_memory is not None:
        g = out.generation
        saved = save_memory(args.save_memory, run, g.memory, g.next_logits, replace=continued)
        print(f"saved the memory to {saved}; continue with --load-memory {saved}", file=sys.stderr)


def _prompts(args: argparse.Namespace) -> list[str]:
    if args.prompt is not None and args.prompts_file is not None:
        raise ConfigError("--prompt and --prompts-file: give one of them")
    if args.prompts_file is not None:
        if args.load_memory is not None:
            raise ConfigError("--load-memory: continues one document; use --prompt, not --prompts-file")
        return read_prompts(args.prompts_file)
    if args.prompt is None and args.load_memory is None:
        raise ConfigError(
            "--prompt: give the text to continue (or --prompts-file, or --load-memory to go on from a saved memory)"
        )
    return [args.prompt or ""]
