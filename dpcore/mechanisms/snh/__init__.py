"""Spatial Neural Histograms (SNH), split by job:

- :mod:`.mechanism`: the mechanism (data collection, the only step that reads data, and the fit);
- :mod:`dpcore.grid.pyramid`: the noisy pyramid's maths (pure numpy, shared with the public denoiser's
  training, so it sits below the mechanisms and is re-exported here);
- :mod:`.denoisers`: which public denoiser a release applies (public inputs only);
- :mod:`.augmentation`: training squares and the public workload's weights;
- :mod:`.training`: the nets (torch);
- :mod:`.rules`: post-processing rules and their tuned constants;
- :mod:`.synopsis`: answering, saving and loading.

Names are resolved on first use, so importing the pyramid maths (or reading the mechanism's tags)
does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "SpatialNeuralHistogram": "mechanism",
    "SNHSynopsis": "synopsis",
    "train_snh": "training", "pick_device": "training",
    "known_total": "denoisers", "choose_denoiser": "denoisers", "band_denoiser": "denoisers",
    **{n: "augmentation" for n in ("query_sides", "augment", "sample_corners", "workload_overlaps",
                                   "load_public_workload", "check_workload", "normalise_xy")},
    **{n: "dpcore.grid.pyramid" for n in ("pyramid_upward", "pyramid_estimate", "cap_to_levels", "release_pyramid",
                              "pyramid_size", "LEVEL_DIVISORS", "LEVEL_WEIGHTS", "shrink_down",
                              "join_fine_level", "refine_to_fine")},
    **{n: "rules" for n in ("PSI_FRACTION", "LOSSES", "ANSWER_RULES", "BLEND_SMALL_SIDE_M", "GEOMETRIC_NETS_WEIGHTS",
                            "BLEND_NETS_WEIGHT_SMALL", "FINE_NETS_WEIGHT_SMALL", "BLEND_LARGE_STEPS", "BLEND_NETS_WEIGHT_LOW_SIGNAL",
                            "PLAIN_BLEND_MIN_SIGNAL", "release_signal", "blend_nets_weights", "DATA_COLLECTIONS",
                            "DENOISER_GRIDS", "DENOISER_CAP_SIGMAS", "CAVEAT_DROPPED_FRACTION",
                            "DENOISER_MAX_SIGNAL", "BLEND_KEY", "DENOISED_RULES_KEY", "PLAIN_RULES_KEY")},
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # a dotted name is a module outside this package (the pyramid maths live in dpcore.grid)
    path = module if "." in module else f"{__name__}.{module}"
    return getattr(importlib.import_module(path), name)
