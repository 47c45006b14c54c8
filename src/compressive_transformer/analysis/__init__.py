"""The paper's analyses for any trained model, as pure functions returning JSON-ready dicts (plots in :mod:`.plots`):

- :func:`attention_by_region`: average attention in buckets oldest -> newest over compressed memory, memory and
  the current segment (Figure 3);
- :func:`held_out_compressibility` / :func:`compressibility_over_training`: compression loss per layer (Figure 2);
- :func:`frequency_perplexity` / :func:`compare_frequency`: word perplexity by train-frequency bucket (Table 6b);
- :func:`empirical_temporal_range`: how far back a perturbation still changes the output, next to l(n_m + c n_cm);
- :func:`training_curves`: several runs' metrics on one plot.
"""

from compressive_transformer.analysis.compressibility import compressibility_over_training, held_out_compressibility
from compressive_transformer.analysis.curves import curves_from_records, training_curves
from compressive_transformer.analysis.frequency import (
    WIKITEXT_BUCKETS,
    bucket_perplexity,
    compare_frequency,
    frequency_perplexity,
    frequency_table,
    token_words,
    word_counts,
)
from compressive_transformer.analysis.regions import (
    RegionAccumulator,
    attention_by_region,
    bucket_attention,
    bucket_table,
)
from compressive_transformer.analysis.temporal import empirical_temporal_range

__all__ = [
    "WIKITEXT_BUCKETS",
    "RegionAccumulator",
    "attention_by_region",
    "bucket_attention",
    "bucket_perplexity",
    "bucket_table",
    "compare_frequency",
    "compressibility_over_training",
    "curves_from_records",
    "empirical_temporal_range",
    "frequency_perplexity",
    "frequency_table",
    "held_out_compressibility",
    "token_words",
    "training_curves",
    "word_counts",
]
