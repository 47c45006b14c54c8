import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)

from compressive_transformer import CompressiveTransformerLM, ModelConfig  # noqa: E402

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def tiny_config(**overrides) -> ModelConfig:
    base = dict(
        vocab_size=32, d_model=16, n_layers=2, n_heads=2, d_ff=32, seg_len=8, mem_len=8, cmem_len=4,
        compression_rate=2, compression="conv", compression_loss="attention", dropout=0.0,
    )  # fmt: skip
    base.update(overrides)
    return ModelConfig(**base)


def tiny_model(seed: int = 0, **overrides) -> CompressiveTransformerLM:
    torch.manual_seed(seed)
    model = CompressiveTransformerLM(tiny_config(**overrides)).double()
    return model.eval()


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real corpora not found at {SHARED_DATA} (they exist only in the development workplace)")
    return SHARED_DATA
