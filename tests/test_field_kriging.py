"""The ``kriging`` baseline: per-scene variogram, quadrant neighbours over the whole scene."""

from __future__ import annotations

import numpy as np
import pytest

from geonp.models.field_kriging import krige_scene, krige_stack, quadrant_neighbours


def brute_quadrants(points: np.ndarray, target: np.ndarray, k: int) -> list[set[int]]:
    d = points - target
    dr, dc = d[:, 0], d[:, 1]
    masks = [(dr >= 0) & (dc > 0), (dr > 0) & (dc <= 0), (dr <= 0) & (dc < 0), (dr < 0) & (dc >= 0)]
    dist = np.linalg.norm(d, axis=1)
    out = []
    for m in masks:
        idx = np.flatnonzero(m)
        out.append(set(idx[np.argsort(dist[idx], kind="stable")[:k]].tolist()))
    return out


def test_quadrant_neighbours_match_a_brute_force_search():
    rng = np.random.default_rng(0)
    points = rng.integers(0, 60, (300, 2)).astype(float)
    points = np.unique(points, axis=0)
    targets = np.array([[30.5, 30.5], [0.0, 0.0], [59.0, 10.0], [25.0, 61.0]])
    near = quadrant_neighbours(points, targets, 5).reshape(len(targets), 4, 5)
    for t, target in enumerate(targets):
        for q, want in enumerate(brute_quadrants(points, target, 5)):
            got = {int(i) for i in near[t, q] if i >= 0}
            # Ties in distance may pick either point: compare the distances, not the indices.
            dist = lambda s, x=target: sorted(np.round(np.linalg.norm(points[list(s)] - x, axis=1), 9))  # noqa: E731
            assert dist(got) == dist(want), (t, q)


def test_deep_in_a_gap_every_rim_is_a_neighbour():
    yy, xx = np.mgrid[0:41, 0:41]
    observed = (np.abs(yy - 20) > 12) | (np.abs(xx - 20) > 12)  # a 25 x 25 hole in the middle
    points = np.argwhere(observed).astype(float)
    near = quadrant_neighbours(points, np.array([[20.0, 14.0]]), 4)[0]
    sides = points[near]
    # The 16 nearest observed cells all lie on the left rim (6 cells away); the quadrant search
    # takes half its neighbours from the other side of the target, on the top and bottom rims.
    assert (sides[:, 1] >= 14).sum() == 8 and (sides[:, 0] < 8).any() and (sides[:, 0] > 32).any()
    nearest16 = points[np.argsort(np.linalg.norm(points - [20.0, 14.0], axis=1))[:16]]
    assert (nearest16[:, 1] <= 7).all()


def test_with_every_point_as_neighbour_it_is_pykrige():
    from pykrige.ok import OrdinaryKriging

    rng = np.random.default_rng(3)
    yy, xx = np.mgrid[0:14, 0:15]
    field = np.sin(yy / 3.0) + np.cos(xx / 4.0) + rng.normal(0, 0.1, yy.shape)
    values = field.copy()
    values[rng.random(yy.shape) < 0.75] = np.nan
    valid = np.ones(yy.shape, bool)
    # 60 per quadrant: more than the observed cells, so every one is a neighbour.
    mean, std, fit = krige_scene(values, valid, neighbours=4 * 60, rng=np.random.default_rng(1))
    params = fit["params"]
    # PyKrige given the variogram the scene was fitted (returned in the data's units).
    seen = np.isfinite(values)
    z = values[seen]
    zs = (z - z.mean()) / z.std()
    pts = np.argwhere(seen).astype(float)
    psill, rng_, nugget = params[0] / z.var(), params[1], params[2] / z.var()
    ok = OrdinaryKriging(pts[:, 0], pts[:, 1], zs, variogram_model="exponential",
                         variogram_parameters={"psill": psill, "range": rng_, "nugget": nugget}, exact_values=True)
    gaps = np.argwhere(~seen).astype(float)
    zq, ss = ok.execute("points", gaps[:, 0], gaps[:, 1])
    np.testing.assert_allclose(mean[~seen], z.mean() + z.std() * np.asarray(zq), atol=1e-6)
    # sigma is PyKrige's up to one factor per scene (its calibration against hidden cells).
    ratio = std[~seen] / (z.std() * np.sqrt(np.asarray(ss)))
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-5)
    assert 0.2 < ratio[0] < 5


def test_a_stack_is_kriged_scene_by_scene_and_sparse_scenes_fall_back():
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:30, 0:30]
    values = np.stack([np.sin(yy / 4.0 + t) + np.cos(xx / 5.0) for t in range(3)])
    values[:, 10:18, 10:18] = np.nan
    values[2][rng.random((30, 30)) < 0.98] = np.nan  # too sparse for its own variogram
    mean, std, what = krige_stack(values, np.ones((30, 30), bool))
    gap = np.isnan(values)
    assert np.isfinite(mean[gap]).all() and (std[gap] > 0).all() and np.isnan(mean[~gap]).all()
    truth = np.stack([np.sin(yy / 4.0 + t) + np.cos(xx / 5.0) for t in range(2)])
    assert np.sqrt(np.mean((mean[:2][gap[:2]] - truth[gap[:2]]) ** 2)) < 0.2  # the field spans +-2
    assert "exponential (2)" in what  # the third scene is too sparse for its own variogram


def test_quadrant_counts_count_what_the_search_splits():
    from geonp.models.field_kriging import quadrant_counts

    rng = np.random.default_rng(1)
    observed = rng.random((20, 25)) < 0.3
    cells = np.array([[0, 0], [10, 12], [19, 24], [5, 20]])
    counts = quadrant_counts(observed, cells)
    points = np.argwhere(observed).astype(float)
    for cell, got in zip(cells, counts):
        assert [len(s) for s in brute_quadrants(points, cell.astype(float), 10**6)] == list(got)
    near = quadrant_neighbours(points, cells.astype(float), 50, available=counts).reshape(4, 4, 50)
    assert [[int((q >= 0).sum()) for q in t] for t in near] == np.minimum(counts, 50).tolist()


def test_grid_semivariance_counts_every_pair_along_rows_columns_and_diagonals():
    from geonp.variogram import grid_semivariance

    rng = np.random.default_rng(2)
    values = rng.normal(size=(9, 11))
    values[rng.random(values.shape) < 0.3] = np.nan
    lag, gam, cnt = grid_semivariance(values, 3)
    pts = np.argwhere(np.isfinite(values))
    want = {}
    for (r1, c1) in pts:
        for (r2, c2) in pts:
            dr, dc = r2 - r1, c2 - c1
            steps = max(abs(dr), abs(dc))
            if (dr, dc) > (0, 0) and 0 < steps <= 3 and (dr == 0 or dc == 0 or abs(dr) == abs(dc)) and dr >= 0 \
                    and not (dr == 0 and dc < 0):
                h = round(float(np.hypot(dr, dc)), 9)
                want.setdefault(h, []).append(0.5 * (values[r1, c1] - values[r2, c2]) ** 2)
    assert sorted(want) == [round(float(x), 9) for x in lag]
    for h, g, n in zip(lag, gam, cnt):
        assert n == len(want[round(float(h), 9)]) and g == pytest.approx(np.mean(want[round(float(h), 9)]))


def test_sigma_is_calibrated_on_cloud_shaped_gaps():
    """A smooth field kriged with the rough exponential family: kriging's own sigma is far too
    wide; after the check against cells hidden under clouds the 90% interval covers about 90%."""
    from geonp.tasks.clouds import random_clouds

    rng = np.random.default_rng(5)
    yy, xx = np.mgrid[0:80, 0:90]
    field = np.sin(yy / 9.0) * np.cos(xx / 11.0) + 0.3 * np.sin((xx + yy) / 5.0) + rng.normal(0, 0.01, yy.shape)
    values = field.copy()
    gaps = random_clouds(yy.shape, 0.3, rng, 5.0)
    values[gaps] = np.nan
    mean, std, _ = krige_scene(values, np.ones(yy.shape, bool))
    z = np.abs(mean[gaps] - field[gaps]) / std[gaps]
    assert 0.8 < np.mean(z < 1.645) < 0.97


def test_universal_kriging_with_a_linear_drift_agrees_with_pykrige():
    """The drift's bordered system against PyKrige's UniversalKriging (regional linear drift) given
    the same variogram: an independent implementation of the same predictor."""
    from pykrige.uk import UniversalKriging

    from geonp.models.field_kriging import _kriger

    rng = np.random.default_rng(3)
    yy, xx = np.mgrid[0:24, 0:24]
    field = 0.2 * yy - 0.1 * xx + np.sin(yy / 3.0) + rng.normal(0, 0.1, yy.shape)
    seen = rng.random(yy.shape) < 0.3
    pts = np.argwhere(seen).astype(float)
    z = field[seen]
    params = [0.8, 6.0, 0.05]
    krige = _kriger(pts, z, seen, "exponential", params, neighbours=4 * 200, drift=True)  # every point a neighbour
    cells = np.argwhere(~seen).astype(float)
    mean, sd = krige(seen, cells)
    uk = UniversalKriging(pts[:, 0], pts[:, 1], z, variogram_model="exponential",
                          variogram_parameters={"psill": params[0], "range": params[1], "nugget": params[2]},
                          drift_terms=["regional_linear"], exact_values=True)
    zq, ss = uk.execute("points", cells[:, 0], cells[:, 1])
    np.testing.assert_allclose(mean, np.asarray(zq), atol=1e-5)
    np.testing.assert_allclose(sd**2, np.asarray(ss), atol=1e-5)


def test_a_scene_with_a_trend_is_kriged_with_one_where_the_check_says_so():
    rng = np.random.default_rng(4)
    yy, xx = np.mgrid[0:60, 0:60]
    field = 0.15 * yy + 0.1 * xx + 0.3 * np.sin(xx / 2.0) + rng.normal(0, 0.05, yy.shape)
    values = field.copy()
    values[15:45, 20:50] = np.nan  # a wide cloud across the trend
    valid = np.ones(yy.shape, bool)
    plain, _, fit0 = krige_scene(values, valid, rng=np.random.default_rng(0))
    chosen, _, fit = krige_scene(values, valid, trend="auto", variogram_model="auto", rng=np.random.default_rng(0))
    assert fit0["trend"] is False and fit["trend"] is True and fit["model"] in ("exponential", "spherical", "gaussian")
    gap = np.isnan(values)
    rmse = lambda m: float(np.sqrt(np.mean((m[gap] - field[gap]) ** 2)))  # noqa: E731
    assert rmse(chosen) < rmse(plain)


def test_the_check_can_hide_cells_under_the_scenes_own_gaps_moved():
    rng = np.random.default_rng(5)
    yy, xx = np.mgrid[0:50, 0:50]
    values = np.sin(yy / 5.0) + np.cos(xx / 6.0) + rng.normal(0, 0.05, yy.shape)
    values[10:30, 15:35] = np.nan
    valid = np.ones(yy.shape, bool)
    for check in ("clouds", "gaps"):
        mean, std, fit = krige_scene(values, valid, check=check, rng=np.random.default_rng(0))
        gap = np.isnan(values)
        assert np.isfinite(mean[gap]).all() and (std[gap] > 0).all() and fit["model"] == "exponential"
    with pytest.raises(ValueError, match="check"):
        krige_scene(values, valid, check="nope")


def test_kriging_with_an_external_drift_agrees_with_pykrige():
    """Elevation as an external drift: the bordered system against PyKrige's UniversalKriging with a
    specified drift, given the same variogram and every point as a neighbour."""
    from pykrige.uk import UniversalKriging

    from geonp.models.field_kriging import _kriger

    rng = np.random.default_rng(6)
    yy, xx = np.mgrid[0:24, 0:24]
    elevation = 400.0 * np.exp(-((yy - 10.0) ** 2 + (xx - 14.0) ** 2) / 60.0) + 5.0 * xx
    field = 280.0 - 0.0065 * elevation + np.sin(yy / 3.0) + rng.normal(0, 0.1, yy.shape)
    seen = rng.random(yy.shape) < 0.3
    pts, z = np.argwhere(seen).astype(float), field[seen]
    params = [0.8, 6.0, 0.05]
    krige = _kriger(pts, z, seen, "exponential", params, neighbours=4 * 200, drift=False, maps=elevation[None])
    cells = np.argwhere(~seen).astype(float)
    mean, sd = krige(seen, cells)
    uk = UniversalKriging(pts[:, 0], pts[:, 1], z, variogram_model="exponential",
                          variogram_parameters={"psill": params[0], "range": params[1], "nugget": params[2]},
                          drift_terms=["specified"], specified_drift=[elevation[seen]], exact_values=True)
    zq, ss = uk.execute("points", cells[:, 0], cells[:, 1], specified_drift_arrays=[elevation[~seen]])
    np.testing.assert_allclose(mean, np.asarray(zq), atol=1e-5)
    np.testing.assert_allclose(sd**2, np.asarray(ss), atol=1e-5)


def test_a_field_that_follows_elevation_is_kriged_with_it_where_the_check_says_so():
    """Temperature that falls with height across a ridge under a wide cloud: with the DEM as an
    external drift the check takes it and the gap's error falls; a flat DEM is left out."""
    rng = np.random.default_rng(7)
    yy, xx = np.mgrid[0:60, 0:60]
    elevation = 1500.0 * np.exp(-((xx - 35.0) ** 2) / 40.0) + 300.0 * np.sin(yy / 9.0) ** 2
    field = 285.0 - 0.0065 * elevation + 0.3 * np.sin(xx / 7.0 + yy / 11.0) + rng.normal(0, 0.05, yy.shape)
    values = field.copy()
    values[15:45, 20:50] = np.nan
    valid = np.ones(yy.shape, bool)
    plain, _, fit0 = krige_scene(values, valid, rng=np.random.default_rng(0))
    with_dem, sd, fit = krige_scene(values, valid, rng=np.random.default_rng(0), drift_maps=elevation[None])
    gap = np.isnan(values)
    rmse = lambda m: float(np.sqrt(np.mean((m[gap] - field[gap]) ** 2)))  # noqa: E731
    assert fit0["external"] is False and fit["external"] is True
    assert rmse(with_dem) < 0.5 * rmse(plain) and (sd[gap] > 0).all()
    _, _, flat = krige_scene(values, valid, rng=np.random.default_rng(0), drift_maps=np.zeros((1, 60, 60)))
    assert flat["external"] is False


def test_infill_krigs_with_the_dem_as_an_external_drift_and_says_so():
    """``geonp.infill(..., model="kriging", elevation=DEM)``: the DEM reaches the kriging as an
    external drift (recorded in the history); dineof still refuses a DEM."""
    import xarray as xr

    import geonp

    rng = np.random.default_rng(8)
    lat, lon = np.linspace(44.0, 47.0, 48), np.linspace(6.0, 10.0, 56)
    yy, xx = np.meshgrid(np.arange(48), np.arange(56), indexing="ij")
    height = 2500.0 * np.exp(-((xx - 30.0) ** 2) / 50.0) + 200.0 * np.sin(yy / 8.0) ** 2
    t2m = 288.0 - 0.0065 * height + 0.2 * np.sin(xx / 9.0) + rng.normal(0, 0.05, yy.shape)
    seen = t2m.copy()
    seen[10:38, 18:44] = np.nan
    ds = xr.Dataset({"t2m": (("time", "lat", "lon"), seen[None])},
                    coords={"time": [np.datetime64("2020-01-01")], "lat": lat, "lon": lon})
    dem = xr.DataArray(height, coords={"lat": lat, "lon": lon}, dims=("lat", "lon"), name="elevation")
    plain = geonp.infill(ds, "t2m", model="kriging")
    drift = geonp.infill(ds, "t2m", model="kriging", elevation=dem)
    assert "external drift" in drift.attrs["geonp_history"] and "external" not in plain.attrs["geonp_history"]
    gap = np.isnan(seen)
    rmse = lambda out: float(np.sqrt(np.mean((out["t2m"].values[0][gap] - t2m[gap]) ** 2)))  # noqa: E731
    assert rmse(drift) < 0.5 * rmse(plain)
    with pytest.raises(ValueError, match="--elevation: model 'dineof' takes no elevation"):
        geonp.infill(ds, "t2m", model="dineof", elevation=dem)
