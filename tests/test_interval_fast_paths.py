"""The vectorised evaluation of answers, noise models and the spread (prefix tables read with np.take, every
box at once) against the straightforward computation, cell by cell, on random boxes of a default user-level
release of every 2-D mechanism (issue 43 item 1: speed changes how answers and intervals are evaluated, never
what they are)."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from dpcore.mechanisms import FitInput, get_mechanism
from dpcore.privacy.noise import NoiseSource
from dpcore.privacy.profile import PROFILE_FRACTION, noisy_profile, profile_counts
from dpcore.privacy.scaling import fit_profiled
from dpcore.synopsis import spread as spread_mod
from dpcore.synopsis.noise import BootstrapNoise, LeafNoise

MECHANISMS = {"identity": {"cell_width_m": 250.0}, "ug": {}, "ag": {}, "hb": {}, "privtree": {}, "auto": {}}


@pytest.fixture(scope="module")
def releases():
    region = city_region("new-york")
    pts = generate_checkins(region, n_users=300, days=3, seed=5)
    x, y = region.project(pts["lat"].to_numpy(), pts["lon"].to_numpy())
    data = FitInput(x, y, region, "user", 10, user=pts["user_id"].to_numpy())
    per_user = np.bincount(np.unique(data.user, return_inverse=True)[1])
    profile = noisy_profile(profile_counts(per_user), PROFILE_FRACTION, NoiseSource.seeded(2))
    return {name: fit_profiled(get_mechanism(name, **params), data, 1.0, NoiseSource.seeded(3), profile)
            for name, params in MECHANISMS.items()}


def _boxes(region, n: int, seed: int) -> np.ndarray:
    """Squares of 5 m – 8 km anywhere in (and past the edge of) the region, a few typed inverted."""
    rng = np.random.default_rng(seed)
    side = np.exp(rng.uniform(np.log(5.0), np.log(8000.0), n))
    cx, cy = rng.uniform(-1.1 * region.half_m, 1.1 * region.half_m, (2, n))
    b = np.stack([cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2], axis=1)
    b[::17] = b[::17][:, [2, 3, 0, 1]]
    return b


def _fractions(lo: np.ndarray, hi: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """(boxes, cells) covered fraction of each cell of an axis."""
    a, b = np.minimum(lo, hi)[:, None], np.maximum(lo, hi)[:, None]
    return np.clip(np.minimum(b, edges[None, 1:]) - np.maximum(a, edges[None, :-1]), 0, None) / np.diff(edges)


def _ring(f: np.ndarray) -> np.ndarray:
    """(boxes, cells): the first and the last cell each box covers on an axis."""
    some = f > 0
    idx = np.arange(f.shape[1])[None, :]
    first = np.argmax(some, axis=1)[:, None]
    last = f.shape[1] - 1 - np.argmax(some[:, ::-1], axis=1)[:, None]
    return some & ((idx == first) | (idx == last))


def _cells(prefix: np.ndarray) -> np.ndarray:
    """The cell values behind a prefix table (nx+1, ny+1, ...)."""
    return np.diff(np.diff(prefix, axis=0), axis=1)


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_answers_are_the_cell_by_cell_sums(releases, name):
    inner = releases[name].inner
    xmin, ymin, xmax, ymax = inner.region.bounds_m
    boxes = _boxes(inner.region, 400, 1)
    nx, ny = inner.values.shape
    fx = _fractions(boxes[:, 0], boxes[:, 2], np.linspace(xmin, xmax, nx + 1))
    fy = _fractions(boxes[:, 1], boxes[:, 3], np.linspace(ymin, ymax, ny + 1))
    want = np.sum((fx @ inner.values) * fy, axis=1)
    assert inner.answer(boxes) == pytest.approx(want, rel=1e-9, abs=1e-9 * np.abs(inner.values).sum())


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_the_spread_is_the_cell_by_cell_sum_over_cut_cells(releases, name):
    syn = releases[name]
    cells = syn.spread_model()
    boxes = _boxes(syn.region, 300, 2)
    xmin, ymin, xmax, ymax = cells.bounds
    v, w, e, r, q = (np.zeros(len(boxes)) for _ in range(5))
    for (nx, ny), prefix, _, _ in cells.grids:
        y, sq, _, held = np.moveaxis(_cells(prefix.reshape(nx + 1, ny + 1, 4)), -1, 0)
        fx = _fractions(boxes[:, 0], boxes[:, 2], np.linspace(xmin, xmax, nx + 1))
        fy = _fractions(boxes[:, 1], boxes[:, 3], np.linspace(ymin, ymax, ny + 1))
        f = fx[:, :, None] * fy[:, None, :]
        cut = (f > 0) & (f < 1 - 1e-12) & (held[None] > 0.5)
        g = np.where(cut, f * (1 - f), 0.0)
        v += np.einsum("qij,ij->q", g, sq)
        w += np.einsum("qij,ij->q", g * g, sq * sq)
        # E as the release computes it: over the box's first and last rows and columns, whole cells there
        # included (a box reaching past the region's edge covers its edge cells whole)
        ring = _ring(fx)[:, :, None] | _ring(fy)[:, None, :]
        e += np.einsum("qij,ij->q", np.where(ring & (held[None] > 0.5), f, 0.0), y)
        r += np.einsum("qij,ij->q", np.where(cut, 1 - f, 0.0), y)
        q += np.einsum("qij,ij->q", np.where(cut, (1 - f) ** 2, 0.0), held)
    z = NormalDist().inv_cdf(0.975)
    a0, a1, b0, b1 = spread_mod.FACTORS[cells.kind]
    inv_m2 = np.where(v > 0, w / np.where(v > 0, v * v, 1.0), 0.0) ** 2
    below = np.minimum(z * np.sqrt(v) * (a0 + a1 * inv_m2), e)
    above = np.minimum(z * np.sqrt(v) * (b0 + b1 * inv_m2), r + z * cells.cell_sd * np.sqrt(q))
    got_below, got_above = cells.halfwidths(boxes)
    scale = np.abs(below).max() + np.abs(above).max()
    # equal to the rounding of the prefix tables (Σ y⁴ over a grid reaches 1e15: its differences keep ~1e-6)
    assert got_below == pytest.approx(below, rel=1e-4, abs=1e-9 * scale)
    assert got_above == pytest.approx(above, rel=1e-4, abs=1e-9 * scale)


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_noise_moments_are_the_cell_by_cell_sums(releases, name):
    inner = releases[name].inner
    model = inner.noise_model()
    boxes = _boxes(inner.region, 300, 3)
    xmin, ymin, xmax, ymax = inner.region.bounds_m
    var, _ = model.moments(boxes)
    if isinstance(model, BootstrapNoise):
        field, _, small = model.field_moments(boxes)
        # a box narrower than NEAREST_CELLS field cells takes at least its own leaves' variance
        # (tests/test_coverage_terms.py); every other box reads the error fields alone
        assert np.all(var >= field) and np.array_equal(var[~small], field[~small])
        var = field
        p = model._error_prefix()
        nx, ny = p.shape[0] - 1, p.shape[1] - 1
        fields = _cells(p.astype(np.float64))  # (nx, ny, draws)
        gx = np.clip((np.sort(boxes[:, [0, 2]], axis=1) - xmin) * nx / (xmax - xmin), 0, nx)
        gy = np.clip((np.sort(boxes[:, [1, 3]], axis=1) - ymin) * ny / (ymax - ymin), 0, ny)
        near = (gx[:, 1] - gx[:, 0] >= 4) & (gy[:, 1] - gy[:, 0] >= 4)  # read at the nearest nodes
        gx[near], gy[near] = np.rint(gx[near]), np.rint(gy[near])
        fx = _fractions(gx[:, 0], gx[:, 1], np.arange(nx + 1.0))
        fy = _fractions(gy[:, 0], gy[:, 1], np.arange(ny + 1.0))
        err = np.einsum("qi,ijd,qj->qd", fx, fields, fy, optimize=True)
        want = np.mean(err ** 2, axis=1)
        # the error fields are summed in float32 prefix tables: equal to their rounding
        assert var == pytest.approx(want, rel=1e-3, abs=1e-5 * want.max())
    elif isinstance(model, LeafNoise):
        d = inner.arrays["leaf_depth"].astype(np.int64)
        i = inner.arrays["leaf_index"].astype(np.int64)
        n = 2 ** d
        wx, wy = (xmax - xmin) / n, (ymax - ymin) / n
        x0, y0 = xmin + (i // n) * wx, ymin + (i % n) * wy
        (xa, xb), (ya, yb) = np.sort(boxes[:, [0, 2]], axis=1).T, np.sort(boxes[:, [1, 3]], axis=1).T
        f = (np.clip(np.minimum(xb[:, None], x0 + wx) - np.maximum(xa[:, None], x0), 0, None) / wx
             * np.clip(np.minimum(yb[:, None], y0 + wy) - np.maximum(ya[:, None], y0), 0, None) / wy)
        want = model.law.variance * np.sum(f ** 2, axis=1)
        assert var == pytest.approx(want, rel=1e-9, abs=1e-12 * model.law.variance)
    else:  # a uniform grid's cells
        nx, ny = inner.values.shape
        fx = _fractions(boxes[:, 0], boxes[:, 2], np.linspace(xmin, xmax, nx + 1))
        fy = _fractions(boxes[:, 1], boxes[:, 3], np.linspace(ymin, ymax, ny + 1))
        want = model.law.variance * np.sum(fx ** 2, axis=1) * np.sum(fy ** 2, axis=1)
        assert var == pytest.approx(want, rel=1e-9, abs=1e-12 * model.law.variance)


def test_a_small_error_field_gives_the_draws_own_variance(releases):
    """HB's leaf grid is small: its boxes' variances come from the cells' error covariance over the draws
    (w·C·w), which must equal the mean over the draws of each box's error read from the prefix tables."""
    model = releases["hb"].inner.noise_model()
    boxes = _boxes(releases["hb"].region, 2000, 4)
    var, terms = model.moments(boxes)
    assert model._cov is not None  # the covariance path ran
    gather = type(model).__new__(type(model))
    gather.__dict__.update(model.__dict__)
    gather._cov = None  # the same draws, read draw by draw
    var_draws, terms_draws = gather.moments(boxes)
    assert np.array_equal(terms, terms_draws)
    assert var == pytest.approx(var_draws, rel=1e-3, abs=1e-6 * var_draws.max())


def test_the_bootstraps_raster_of_leaf_errors_is_the_releases_rasterisation():
    """AG's bootstrap rasterises each draw's leaf errors with shares found once (RectangleRaster, a bincount)
    instead of the release's sparse products (rasterise_rectangles): the same raster."""
    from dpcore.mechanisms.ug import RectangleRaster, rasterise_rectangles

    region = city_region("new-york")
    rng = np.random.default_rng(7)
    h = region.half_m
    x0, y0 = rng.uniform(-1.05 * h, h, (2, 300))
    x1, y1 = x0 + rng.uniform(0, 3000, 300), y0 + rng.uniform(0, 3000, 300)  # some past the edge, some empty
    x1[::29] = x0[::29]
    raster = RectangleRaster(x0, y0, x1, y1, region, 97)
    for _ in range(3):
        mass = rng.normal(0, 20, 300)
        want = rasterise_rectangles(x0, y0, x1, y1, mass, region, 97)
        assert raster(mass) == pytest.approx(want, rel=1e-12, abs=1e-12 * np.abs(mass).sum())


def test_a_mid_sized_error_fields_small_boxes_read_the_draws_own_variance():
    """A field of 65-1,024 cells (HB's 16 × 16 leaf grid) gives a box narrower than 4 cells each way its
    variance from the sums of its 5 × 5 cells' error products over the draws; it must equal the mean over the
    draws of the box's error read from the prefix tables."""
    from dpcore.synopsis.noise import NoiseLaw

    class Field(BootstrapNoise):
        def draw_errors(self, rng):
            return rng.normal(0.0, 3.0, (12, 12)) + rng.normal(0.0, 1.0)  # correlated cells, as consistency makes

    bounds = (-10_000.0, -10_000.0, 10_000.0, 10_000.0)
    model = Field(NoiseLaw("laplace", 2.0), (12, 12), bounds)
    rng = np.random.default_rng(8)
    side = np.exp(rng.uniform(np.log(1.0), np.log(12_000.0), 3000))
    cx, cy = rng.uniform(-11_000, 11_000, (2, 3000))
    boxes = np.stack([cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2], axis=1)
    boxes[::5, 2] += 20_000  # long, thin boxes read the draws
    var, terms = model.moments(boxes)
    assert model._window is not None  # the window path ran
    model._window = None
    var_draws, terms_draws = model.moments(boxes)
    assert np.array_equal(terms, terms_draws)
    assert var == pytest.approx(var_draws, rel=1e-4, abs=1e-7 * var_draws.max())


def test_window_sums_grouped_by_first_cell_are_each_boxs_own_sum_over_the_draws():
    """HB's small boxes read f·S·f grouped by their first cell (one matrix product per cell): each must be
    Σ over the draws of (Σ over the field's cells of f·error)², f the box's pro-rata covered fractions,
    summed box by box in float64."""
    from dpcore.synopsis.noise import _window_sum_squares, _window_sums

    rng = np.random.default_rng(11)
    nx, ny, draws, w = 9, 7, 30, 5
    e = rng.normal(0.0, 2.0, (nx, ny, draws)) + rng.normal(0.0, 1.0, draws)
    n = 2000
    x0, y0 = rng.uniform(0, nx, n), rng.uniform(0, ny, n)
    gx = [x0, np.minimum(x0 + rng.uniform(0, w - 1, n), nx)]
    gy = [y0, np.minimum(y0 + rng.uniform(0, w - 1, n), ny)]
    got = _window_sum_squares(_window_sums(e, w), nx, ny, w, gx, gy, 64)
    want = np.empty(n)
    for q in range(n):
        fx = np.clip(np.minimum(gx[1][q], np.arange(nx) + 1.0) - np.maximum(gx[0][q], np.arange(nx)), 0.0, 1.0)
        fy = np.clip(np.minimum(gy[1][q], np.arange(ny) + 1.0) - np.maximum(gy[0][q], np.arange(ny)), 0.0, 1.0)
        err = np.einsum("i,j,ijd->d", fx, fy, e)
        want[q] = err @ err
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12 * want.max())


def test_grid_power_sums_in_blocks_are_the_cell_by_cell_sums():
    """grid_power_sums runs in blocks of boxes: over more than two blocks, Σ w² and Σ w⁴ must be the sums over
    the grid's cells of each cell's covered fraction fx·fy squared and to the fourth."""
    from dpcore.synopsis.noise import POWER_BLOCK, grid_power_sums

    region = city_region("new-york")
    xmin, ymin, xmax, ymax = region.bounds_m
    boxes = _boxes(region, 2 * POWER_BLOCK + 123, 7)
    fx = _fractions(boxes[:, 0], boxes[:, 2], np.linspace(xmin, xmax, 13 + 1))
    fy = _fractions(boxes[:, 1], boxes[:, 3], np.linspace(ymin, ymax, 9 + 1))
    s2, s4 = grid_power_sums(boxes, (13, 9), region.bounds_m)
    assert s2 == pytest.approx((fx ** 2).sum(1) * (fy ** 2).sum(1), rel=1e-12, abs=1e-15)
    assert s4 == pytest.approx((fx ** 4).sum(1) * (fy ** 4).sum(1), rel=1e-12, abs=1e-15)
