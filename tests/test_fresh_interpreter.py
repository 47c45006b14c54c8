"""Every public entry point works in a fresh interpreter, whatever was (not) imported before: each case runs in its
own subprocess with nothing of the package loaded (the test session's imports, conftest's included, cannot hide an
import-order bug there). Validating a config reads the extension tables as data; no module registers anything,
writes the process environment or starts anything when it is imported."""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import compressive_transformer
from compressive_transformer.cli import COMMANDS
from compressive_transformer.core.registry import COMPRESSION_LOSSES, COMPRESSORS

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=64, seg_len=16)


def fresh(code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``code`` in a new interpreter (the test session's Triton interpreter choice removed from its
    environment, so nothing the session set can stand in for what the package must do itself)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )


def ok(code: str, *args: str) -> str:
    p = fresh(code, *args)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def _valid(function: str, loss: str) -> bool:
    return COMPRESSORS[function].trainable == COMPRESSION_LOSSES[loss].trains


COMBINATIONS = [(f, loss) for f in COMPRESSORS for loss in COMPRESSION_LOSSES]


@pytest.mark.parametrize("function,loss", COMBINATIONS, ids=[f"{f}+{loss}" for f, loss in COMBINATIONS])
def test_every_builtin_compressor_and_loss_validates_first_thing(function: str, loss: str) -> None:
    """The flat keys of the documented example, nothing imported before: a valid pair builds its config without
    torch, an invalid one is refused in one line that names the loss to use."""
    table = dict(TINY, mem_len=16, cmem_len=8, compression_rate=4, compression=function, compression_loss=loss)
    code = (
        "import json, sys\n"
        "from compressive_transformer import ConfigError, ModelConfig\n"
        "try:\n"
        "    cfg = ModelConfig.from_raw(json.loads(sys.argv[1]))\n"
        "    print('ok', cfg.kind, cfg.compression.function, cfg.compression.loss)\n"
        "except ConfigError as e:\n"
        "    print('refused', e)\n"
        "print('torch' in sys.modules)\n"
    )
    out = ok(code, json.dumps(table)).splitlines()
    if _valid(function, loss):
        assert out[0] == f"ok compressive {function} {loss}"
    else:
        assert out[0].startswith("refused model.compression.loss: ") and "unknown" not in out[0]
    assert out[1] == "False"  # validation reads the tables as data: no model module, no torch


KIND_TABLES = {
    "transformer-xl": (dict(TINY, mem_len=16, cmem_len=0), "compressive", "CompressiveTransformerLM"),
    "compressive": (dict(TINY, mem_len=16, cmem_len=8, compression_rate=4), "compressive", "CompressiveTransformerLM"),
    "transformer-ql": (
        dict(TINY, mem_len=8, cmem_len=0, scales=[1, 1], compression="max_pool", compression_loss="none"),
        "transformer-ql",
        "TransformerQL",
    ),
    "wavenet": (
        dict(TINY, n_layers=3, mem_len=0, cmem_len=0, wavenet_dilations=[1, 2, 4]),
        "wavenet",
        "WaveNet",
    ),
    "wavenet, named": (
        {**TINY, "n_layers": 3, "kind": "wavenet", "memory": {"mem_len": 0, "cmem_len": 0}, "wavenet": {"dilations": [1, 2, 4]}},
        "wavenet",
        "WaveNet",
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(KIND_TABLES))
def test_every_model_kind_validates_and_builds_first_thing(name: str) -> None:
    """Transformer-XL, the Compressive Transformer, Transformer-QL and WaveNet, from a table written before
    ``model.kind`` (the kind read from its shape, once) or naming its kind: validated, then built by build_model."""
    table, kind, cls = KIND_TABLES[name]
    code = (
        "import json, sys\n"
        "from compressive_transformer import ModelConfig, build_model\n"
        "cfg = ModelConfig.from_raw(json.loads(sys.argv[1]))\n"
        "print(cfg.kind)\n"
        "model = build_model(cfg)\n"
        "print(type(model).__name__, sum(p.numel() for p in model.parameters()) > 0)\n"
    )
    assert ok(code, json.dumps(table)).splitlines() == [kind, f"{cls} True"]


def test_a_kind_check_runs_without_the_model_imported_first() -> None:
    """Transformer-QL's own rules run from the table (the check used to be skipped until its module was loaded)."""
    table = dict(TINY, mem_len=8, cmem_len=0, scales=[1, 1], compression="conv", compression_loss="attention")
    code = (
        "import json, sys\n"
        "from compressive_transformer import ConfigError, ModelConfig\n"
        "try:\n"
        "    ModelConfig.from_raw(json.loads(sys.argv[1]))\n"
        "except ConfigError as e:\n"
        "    print(e)\n"
    )
    assert ok(code, json.dumps(table)).startswith("model.compression.function: Transformer-QL pools between scales")


def test_a_saved_run_loads_generates_and_scores_first_thing(finished_run: Path) -> None:
    code = (
        "import sys\n"
        "from compressive_transformer import SamplingConfig, evaluate_text, generate, load_run\n"
        "run = load_run(sys.argv[1], device='cpu')\n"
        "out = generate(run.model, run.encode('The '), max_new_tokens=5, sampling=SamplingConfig(temperature=0))\n"
        "print(len(out.tokens))\n"
        "result = evaluate_text(run, 'A text to score, given as a string.')\n"
        "print(result.bits_per_char > 0)\n"
    )
    assert ok(code, str(finished_run)).splitlines()[-2:] == ["5", "True"]


def test_a_corpus_format_reads_first_thing(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("one two three\n" * 50)
    code = (
        "import sys\n"
        "from compressive_transformer import DataConfig\n"
        "from compressive_transformer.data import read_documents\n"
        "docs = read_documents(DataConfig(format='text', path=sys.argv[1]), 'train')\n"
        "print(len(docs))\n"
    )
    assert int(ok(code, str(tmp_path / "a.txt")).strip()) >= 1


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_prints_its_help_first_thing(command: str) -> None:
    p = fresh("from compressive_transformer.launch import main; main()", command, "--help")
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("usage: compressive-transformer " + command) and not p.stderr


def _modules() -> list[str]:
    return sorted(
        m.name for m in pkgutil.walk_packages(compressive_transformer.__path__, compressive_transformer.__name__ + ".")
    )


def test_importing_the_package_and_any_of_its_modules_changes_no_global_state() -> None:
    """``import compressive_transformer`` and then every module (those whose optional extra is missing aside): the
    process environment, the extension tables, the default dtype and matplotlib's backend are as they were. The
    extras' own libraries are imported before the snapshot (gymnasium sets a pygame variable when imported): what
    is checked is what this package's modules do."""
    code = (
        "import importlib, os, sys\n"
        "before = dict(os.environ)\n"
        "import compressive_transformer\n"
        "assert dict(os.environ) == before, 'import compressive_transformer changed os.environ'\n"
        "from compressive_transformer.core import registry\n"
        "tables = {n: dict(getattr(registry, n)) for n in ('COMPRESSORS', 'COMPRESSION_LOSSES', 'KERNELS', 'MODEL_KINDS', 'FORMATS')}\n"
        "for extra in ('gymnasium', 'minigrid', 'torchrl', 'lm_eval', 'transformers', 'soundfile', 'soxr', 'triton'):\n"
        "    try:\n"
        "        importlib.import_module(extra)\n"
        "    except ImportError:\n"
        "        pass\n"
        "import torch, matplotlib\n"
        "backend, dtype = matplotlib.get_backend(), torch.get_default_dtype()\n"
        "before = dict(os.environ)\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError as e:\n"
        "        print('skipped', name, e.name)\n"
        "        continue\n"
        "    changed = {k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)}\n"
        "    assert not changed, f'importing {name} changed os.environ: {sorted(changed)}'\n"
        "    now = {n: dict(getattr(registry, n)) for n in tables}\n"
        "    assert now == tables, f'importing {name} changed an extension table'\n"
        "    assert matplotlib.get_backend() == backend, f'importing {name} switched matplotlib to {matplotlib.get_backend()}'\n"
        "    assert torch.get_default_dtype() == dtype, f'importing {name} changed the default dtype'\n"
        "print('checked', len(sys.argv) - 1)\n"
    )
    modules = _modules()
    out = ok(code, *modules)
    assert f"checked {len(modules)}" in out


def test_the_command_line_starts_without_the_analysis_libraries() -> None:
    """scipy.stats and matplotlib cost about two seconds to import: a command that needs neither (``data prepare``,
    ``train``, ``--help``) does not pay for them; the commands that use them import them when they run."""
    code = (
        "import sys\n"
        "import compressive_transformer.cli\n"
        "print(sorted(m for m in ('scipy.stats', 'matplotlib', 'matplotlib.figure') if m in sys.modules))\n"
    )
    assert ok(code).strip() == "[]"
