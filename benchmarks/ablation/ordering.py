"""Write OUT/ordering.md: the ablation study's cells ranked by test bits per token beside the paper's ordering.

python benchmarks/ablation/ordering.py benchmarks/ablation
"""

import json
import sys
from pathlib import Path

from compressive_transformer.experiments.ablation_report import study_ordering

if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/ablation")
    text = study_ordering(json.loads((out / "results.json").read_text(encoding="utf-8")))
    (out / "ordering.md").write_text(text, encoding="utf-8")
    print(f"wrote {out / 'ordering.md'}")
