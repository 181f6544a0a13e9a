"""The spatio-temporal resolution rule: public inputs only, recorded spend, slots kept or refused before any charge."""

from __future__ import annotations

import numpy as np
import pytest

from dpcore.geo import Region
from dpcore.mechanisms import get_mechanism
from dpcore.mechanisms.base import MechanismError
from dpcore.mechanisms.inputs import FitInput
from dpcore.mechanisms.st_resolution import carried_slots, slot_refusal, st_resolution
from dpcore.privacy.noise import NoiseSource
from dpcore.synopsis.base import load_synopsis

REGION = Region("toy", 37.76, -122.43, 20.0)
FAST_VDR = {"steps": 5, "batch_size": 2, "crop": 16, "hidden": 8, "code_dim": 4, "n_codes": 8,
            "max_train_seconds": 10.0, "resolution": "rule"}


def _data(seed: int, n: int, t: int = 13, spread_m: float = 2000.0, **kw):
    rng = np.random.default_rng(seed)
    slot = rng.integers(0, t, n)
    x = rng.normal(rng.uniform(-5000, 5000), spread_m, n).clip(-9999, 9999)
    y = rng.normal(rng.uniform(-5000, 5000), spread_m, n).clip(-9999, 9999)
    return FitInput(x, y, REGION, "user", 20, user=np.arange(n) % max(1, n // 20), slot=slot, n_slots=t,
                    slot_seconds=7 * 86400, window_start_s=1_275_000_000, **kw)


def test_rule_keeps_the_slots_and_coarsens_cells_with_less_signal():
    low = st_resolution(2_000, 0.475, 20, 13)
    high = st_resolution(400_000, 0.95, 20, 13)
    # the rule never merges slots (it used to fold all 13 weekly slots into one at this signal)
    assert low.record()["slot_factor"] == high.record()["slot_factor"] == 1
    assert low.record()["coarse_slots"] == 13
    assert low.cells <= 16 < high.cells
    for n in (1e3, 1e4, 1e5, 1e6):
        assert st_resolution(2 * n, 0.5, 20, 21).cells >= st_resolution(n, 0.5, 20, 21).cells
        assert carried_slots(2 * n, 0.5, 20, 21) >= carried_slots(n, 0.5, 20, 21)
    assert all(st_resolution(n, 1.0, 1, 7, privacy_unit="record").cells & (st_resolution(n, 1.0, 1, 7).cells - 1) == 0
               for n in (10, 1e4, 1e7))  # powers of two


def test_slot_refusal_names_the_finest_width_the_size_carries():
    # the month: 28 daily slots, k 20, ε 0.95 for the cells, ~11.8 k points in the window
    why = slot_refusal(11_757, 0.95, 20, 28, 86400, "the public total")
    assert why is not None and "28 requested time slots" in why
    carried = carried_slots(11_757, 0.95, 20, 28)
    assert carried == 6 and "--slot 5d or longer" in why  # ceil(28 / 6) = 5 days
    assert slot_refusal(11_757, 0.95, 20, 6, 5 * 86400, "the public total") is None  # that width is carried
    assert slot_refusal(10, 0.1, 20, 1, 86400, "x") is None  # one slot is never refused
    assert "--slot 2w" in slot_refusal(1_000, 0.95, 20, 2, 7 * 86400, "x")


@pytest.mark.parametrize("mechanism", ["vdr", "identity3d"])
def test_resolution_depends_on_public_inputs_only(mechanism):
    params = FAST_VDR if mechanism == "vdr" else {"resolution": "rule"}
    # very different private data (sizes, places, spread), the same public inputs: n̂ already paid, ε, k, T
    a = _data(1, 3_000, spread_m=500.0, sample_size=200_000.0, public_total=500_000.0)
    b = _data(2, 40_000, spread_m=4000.0, sample_size=200_000.0, public_total=500_000.0)
    ra = get_mechanism(mechanism, **params).fit(a, 0.5, NoiseSource.seeded(1)).extra_meta()["resolution"]
    rb = get_mechanism(mechanism, **params).fit(b, 0.5, NoiseSource.seeded(2)).extra_meta()["resolution"]
    assert ra == rb
    # the public inputs do move it: a hundred times n̂
    c = _data(1, 3_000, spread_m=500.0, sample_size=20_000_000.0, public_total=50_000_000.0)
    rc = get_mechanism(mechanism, **params).fit(c, 0.5, NoiseSource.seeded(1)).extra_meta()["resolution"]
    assert rc["cells"] != ra["cells"]


def test_rule_pays_for_n_hat_and_the_manifest_says_so(tmp_path):
    data = _data(3, 8_000, public_total=30_000.0)
    fixed = get_mechanism("vdr", grid_size=16, **{k: v for k, v in FAST_VDR.items() if k != "resolution"})
    assert [c["name"] for c in fixed.fit(data, 1.0, NoiseSource.seeded(0)).privacy.charges] == ["cell_counts"]
    syn = get_mechanism("vdr", **FAST_VDR).fit(data, 1.0, NoiseSource.seeded(0))
    charges = syn.privacy.charges
    assert [c["name"] for c in charges] == ["sample_size", "cell_counts"]
    assert charges[0]["epsilon"] == pytest.approx(0.05)
    assert sum(c["epsilon"] for c in charges) == pytest.approx(1.0)
    assert all(c["sensitivity"] == 20 for c in charges)
    assert "resolution rule" in charges[0]["note"]
    res = syn.extra_meta()["resolution"]
    m = res["cells"]
    assert syn.values.shape == (m, m, 13)  # released at the rule's cells, over the input's slots
    assert f"{m}x{m}x{res['coarse_slots']}" in charges[1]["note"]
    assert syn.privacy.params["resolution"] == "rule"
    assert any("resolution rule" in note for note in syn.privacy.notes)
    assert syn.values.sum() == pytest.approx(30_000.0, rel=1e-6)
    assert res["slot_factor"] == 1 and res["coarse_slots"] == 13  # every requested slot kept
    syn.save(tmp_path)  # the choice travels with the saved release
    back = load_synopsis(tmp_path)
    assert back.extra_meta()["resolution"] == res and back.values.shape == syn.values.shape
    # an already-paid n̂ is reused, not paid twice
    paid = _data(3, 8_000, public_total=30_000.0, sample_size=25_000.0)
    again = get_mechanism("vdr", **FAST_VDR).fit(paid, 1.0, NoiseSource.seeded(0)).privacy.charges
    assert [c["name"] for c in again] == ["cell_counts"]


def test_auto_resolution_uses_the_rule_only_at_user_level_without_a_grid():
    fast = {k: v for k, v in FAST_VDR.items() if k != "resolution"}
    user = _data(4, 6_000, public_total=40_000.0)
    default = get_mechanism("vdr", **fast)
    assert default.resolution == "auto" and default.uses_rule(user)
    assert default.fine_grid(REGION) == 256
    syn = default.fit(user, 1.0, NoiseSource.seeded(0))
    assert syn.extra_meta()["resolution"] is not None
    assert [c["name"] for c in syn.privacy.charges] == ["sample_size", "cell_counts"]
    # an explicit grid, or record-level privacy, keeps the fixed grid and its charges
    given = get_mechanism("vdr", grid_size=16, **fast)
    assert not given.uses_rule(user)
    assert given.fine_grid(REGION) == 16
    record = FitInput(user.x, user.y, REGION, "record", slot=user.slot, n_slots=13, slot_seconds=7 * 86400,
                      window_start_s=1_275_000_000, public_total=40_000.0)
    assert not default.uses_rule(record)
    rec = default.fit(record, 1.0, NoiseSource.seeded(0))
    assert rec.extra_meta()["resolution"] is None and rec.values.shape == (256, 256, 13)


def test_identity3d_under_the_rule_scales_as_the_fixed_grid_does():
    """The rule's identity3d goes through the same full_scale as the fixed grid: N/n̂ with the n̂ it
    already paid (recorded, not paid twice), 1 at record level, and a bad public total refused."""
    data = _data(5, 8_000, public_total=30_000.0)
    syn = get_mechanism("identity3d", resolution="rule").fit(data, 1.0, NoiseSource.seeded(0))
    extra = syn.extra_meta()
    assert [c["name"] for c in syn.privacy.charges] == ["sample_size", "cell_counts"]
    assert extra["scale_factor"] == pytest.approx(30_000.0 / extra["n_estimate"])
    n = data.x.size
    record = FitInput(data.x, data.y, REGION, "record", slot=data.slot, n_slots=13, slot_seconds=7 * 86400,
                      window_start_s=1_275_000_000, public_total=float(n))
    for mech in (get_mechanism("identity3d", resolution="rule"), get_mechanism("identity3d", grid_size=16)):
        assert mech.fit(record, 1.0, NoiseSource.seeded(0)).extra_meta()["scale_factor"] == 1.0
        bad = FitInput(data.x, data.y, REGION, "user", 20, user=data.user, slot=data.slot, n_slots=13,
                       slot_seconds=7 * 86400, window_start_s=1_275_000_000, public_total=-1.0)
        with pytest.raises(Exception, match="public_total must be a finite count"):
            mech.fit(bad, 1.0, NoiseSource.seeded(0))


@pytest.mark.parametrize("mechanism", ["vdr", "identity3d"])
def test_slots_a_public_size_cannot_carry_are_refused_before_any_charge(mechanism):
    """Issue 44: the rule used to fold such slots into one, silently flat in time. A public size
    (declared total or already-paid n̂) decides it, so the refusal costs nothing and reads nothing private."""
    params = FAST_VDR if mechanism == "vdr" else {"resolution": "rule"}
    charged = []

    class Watch(NoiseSource):
        def random_words(self, size: int) -> np.ndarray:  # every published draw reads these
            charged.append(size)
            return super().random_words(size)

    for extra in ({"public_total": 20_000.0}, {"sample_size": 20_000.0}):
        data = _data(6, 8_000, **extra)  # 13 weekly slots, ε 1, k 20: 20 k points carry 10 slots at most
        with pytest.raises(MechanismError, match=r"13 requested time slots cannot be carried.*--slot 2w or longer"):
            get_mechanism(mechanism, **params).fit(data, 1.0, Watch(secure_mode=False, seed=0))
    assert charged == []
    # without a public size nothing can tell before the charge: the slots are kept, and the notes say
    # what the paid n̂ showed
    syn = get_mechanism(mechanism, **params).fit(_data(6, 8_000), 1.0, NoiseSource.seeded(0))
    assert syn.values.shape[2] == 13 and syn.extra_meta()["resolution"]["slot_factor"] == 1
    assert any("slots kept as asked" in note for note in syn.privacy.notes)
