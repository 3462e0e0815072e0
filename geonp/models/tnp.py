"""Transformer neural processes: ``tnp``, ``pt-tnp``, ``te-tnp``, ``te-pt-tnp``.

All four share one shape: embed context and target points as tokens, run
``num_layers`` attention layers in which targets only ever attend to context (or
to pseudo-tokens), decode target tokens with an MLP into a heteroscedastic
Gaussian. They differ in two switches:

* translation equivariance: the TE models embed only ``y`` (plus a
  context/target flag) and see locations solely through differences inside TE
  attention (:mod:`geonp.models.te_attention`); the others embed ``[x, y, flag]``.
* pseudo-tokens (IST style, Lee et al. 2019): each layer updates ``M`` learned
  pseudo-tokens from the context, the context from the pseudo-tokens, and the
  targets from the pseudo-tokens, costing O(M (Nc + Nt)) instead of
  O(Nc^2 + Nc Nt).

TE models add a learnable distance prior to their attention logits by default
(``distance_prior=False`` is the papers' exact form; see :mod:`geonp.models.te_attention`).

Defaults are the TE-TNP paper's appendix F sizes (token size 128, 8 heads of
16, 5 layers, M = 32); presets ``small`` and ``tiny`` make CPU training practical. te-pt-tnp's
defaults are instead the model geonp ships (:data:`SHIPPED`), its paper form the ``paper`` preset.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributions import Normal

from geonp.models.attention import AttentionBlock
from geonp.models.base import NeuralProcess, check_inputs
from geonp.models.catalog import register
from geonp.models.layers import mlp
from geonp.models.likelihood import GaussianHead
from geonp.models.local_attention import TELocalAttentionBlock, nearest_neighbours, rows_reached
from geonp.models.local_kriging import KrigingConfig, LocalKriging
from geonp.models.te_attention import DEFAULT_BLOCK_ELEMS, TEAttentionBlock

_SIZES = {
    "small": {"dim_model": 64, "num_heads": 4, "head_dim": 16, "num_layers": 3},
    "tiny": {"dim_model": 32, "num_heads": 4, "head_dim": 8, "num_layers": 2},
}
_PT = {"small": {"num_pseudo": 16}, "tiny": {"num_pseudo": 8}}
# The CPU presets allow 4x larger attention blocks than the default 2^24 elements: at
# synthetic-task sizes (B=16, Nt=128, Nc<=64) every layer then fits in one block and
# training skips the recomputation that bounds memory for large Nc (~35% faster).
_TE = {"small": {"dim_kernel_hidden": 32, "max_block_elems": 2**26},
       "tiny": {"dim_kernel_hidden": 16, "max_block_elems": 2**26}}


def _presets(*extra: dict[str, dict]) -> dict[str, dict]:
    return {p: {k: v for e in (_SIZES, *extra) for k, v in e[p].items()} for p in _SIZES}


def _local_attention(value: dict[str, Any] | None, dim_x: int) -> tuple[int, list[float] | None]:
    """A header's ``local_attention`` entry -> ``(neighbours, weights)``; ``(0, None)`` for None.

    Raises:
        ValueError: an unknown key, fewer than one neighbour, or not one weight per location dimension.
    """
    if value is None:
        return 0, None
    if not isinstance(value, dict) or "neighbours" not in value or set(value) - {"neighbours", "weights"}:
        raise ValueError(f"local_attention must be a mapping of neighbours (and weights), got {value!r}")
    k, weights = value["neighbours"], value.get("weights")
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"local_attention neighbours must be a whole number of at least 1, got {k!r}")
    if weights is not None and len(weights) != dim_x:
        raise ValueError(f"local_attention weights need one weight per location dimension ({dim_x}), "
                         f"got {list(weights)}")
    return k, None if weights is None else [float(w) for w in weights]


class _TransformerNP(NeuralProcess):
    """Shared parts: token embedding, decoder, likelihood."""

    def __init__(self, dim_x: int, dim_y: int, dim_model: int, embed_in: int, min_scale: float) -> None:
        super().__init__(dim_x, dim_y)
        self.embed = mlp(embed_in, dim_model, dim_model)
        self.decoder = mlp(dim_model, dim_model, 2 * dim_y)
        self.head = GaussianHead(dim_y, min_scale)

    @staticmethod
    def _flagged(v: torch.Tensor, flag: float) -> torch.Tensor:
        return torch.cat([v, torch.full_like(v[..., :1], flag)], dim=-1)

    def _xy_tokens(self, xc: torch.Tensor, yc: torch.Tensor, xt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Non-TE tokens: context ``[x, y, 1]`` and target ``[x, 0, 0]`` -> ``[B, N, Dz]``."""
        zc = self.embed(self._flagged(torch.cat([xc, yc], -1), 1.0))
        zt = self.embed(self._flagged(torch.cat([xt, xt.new_zeros(*xt.shape[:2], self.dim_y)], -1), 0.0))
        return zc, zt


@register("tnp", presets=_presets())
class TNP(_TransformerNP):
    """TNP-D: self-attention over context tokens, cross-attention targets <- context."""

    def __init__(self, dim_x: int, dim_y: int, dim_model: int = 128, num_heads: int = 8, head_dim: int = 16,
                 num_layers: int = 5, min_scale: float = 1e-3) -> None:
        super().__init__(dim_x, dim_y, dim_model, dim_x + dim_y + 1, min_scale)
        self.self_blocks = nn.ModuleList(AttentionBlock(dim_model, num_heads, head_dim) for _ in range(num_layers))
        self.cross_blocks = nn.ModuleList(AttentionBlock(dim_model, num_heads, head_dim) for _ in range(num_layers))

    def predict(self, xc, yc, xt, mask_c, mask_t) -> Normal:
        zc, zt = self._xy_tokens(xc, yc, xt)  # [B, Nc, Dz], [B, Nt, Dz]
        for sa, ca in zip(self.self_blocks, self.cross_blocks):
            zc = sa(zc, zc, mask_c)
            zt = ca(zt, zc, mask_c)
        return self.head(self.decoder(zt))  # loc/scale [B, Nt, Dy]


@register("pt-tnp", presets=_presets(_PT))
class PTTNP(_TransformerNP):
    """IST-style pseudo-token TNP: pseudo <- context, context <- pseudo, targets <- pseudo."""

    def __init__(self, dim_x: int, dim_y: int, dim_model: int = 128, num_heads: int = 8, head_dim: int = 16,
                 num_layers: int = 5, num_pseudo: int = 32, min_scale: float = 1e-3) -> None:
        super().__init__(dim_x, dim_y, dim_model, dim_x + dim_y + 1, min_scale)
        self.pseudo = nn.Parameter(torch.randn(num_pseudo, dim_model))  # [M, Dz]
        blocks = lambda: nn.ModuleList(AttentionBlock(dim_model, num_heads, head_dim) for _ in range(num_layers))  # noqa: E731
        self.to_pseudo, self.to_context, self.to_target = blocks(), blocks(), blocks()

    def predict(self, xc, yc, xt, mask_c, mask_t) -> Normal:
        b = xc.shape[0]
        zc, zt = self._xy_tokens(xc, yc, xt)  # [B, Nc, Dz], [B, Nt, Dz]
        u = self.pseudo.expand(b, -1, -1)  # [B, M, Dz]
        all_u = torch.ones(u.shape[:2], dtype=torch.bool, device=u.device)
        for to_u, to_c, to_t in zip(self.to_pseudo, self.to_context, self.to_target):
            u = to_u(u, zc, mask_c)
            zc = to_c(zc, u, all_u)
            zt = to_t(zt, u, all_u)
        return self.head(self.decoder(zt))


class _TETransformerNP(_TransformerNP):
    """TE models embed ``[y, 1]`` for context and ``[0, 0]`` for targets: never ``x``."""

    translation_equivariant = True

    def __init__(self, dim_x: int, dim_y: int, dim_model: int, min_scale: float) -> None:
        super().__init__(dim_x, dim_y, dim_model, dim_y + 1, min_scale)

    def _tokens(self, yc: torch.Tensor, xt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        zc = self.embed(self._flagged(yc, 1.0))  # [B, Nc, Dz]
        zt = self.embed(xt.new_zeros(*xt.shape[:2], self.dim_y + 1))  # [B, Nt, Dz]
        return zc, zt

    @staticmethod
    def _te_blocks(num_layers: int, dim_model: int, num_heads: int, head_dim: int, dim_x: int, dim_hidden: int,
                   update_locations: bool, max_block_elems: int, distance_prior: bool) -> nn.ModuleList:
        return nn.ModuleList(
            TEAttentionBlock(dim_model, num_heads, head_dim, dim_x, dim_hidden, update_locations=update_locations,
                             max_block_elems=max_block_elems, distance_prior=distance_prior)
            for _ in range(num_layers)
        )


@register("te-tnp", presets=_presets(_TE))
class TETNP(_TETransformerNP):
    """TE-TNP: TE self-attention over context, TE cross-attention targets <- context."""

    def __init__(self, dim_x: int, dim_y: int, dim_model: int = 128, num_heads: int = 8, head_dim: int = 16,
                 num_layers: int = 5, dim_kernel_hidden: int = 128, update_locations: bool = True,
                 max_block_elems: int = DEFAULT_BLOCK_ELEMS, min_scale: float = 1e-3,
                 distance_prior: bool = True) -> None:
        super().__init__(dim_x, dim_y, dim_model, min_scale)
        args = (num_layers, dim_model, num_heads, head_dim, dim_x, dim_kernel_hidden, update_locations, max_block_elems,
                distance_prior)
        self.self_blocks = self._te_blocks(*args)
        self.cross_blocks = self._te_blocks(*args)

    def predict(self, xc, yc, xt, mask_c, mask_t) -> Normal:
        zc, zt = self._tokens(yc, xt)
        for sa, ca in zip(self.self_blocks, self.cross_blocks):
            zc, xc = sa(zc, xc, zc, xc, mask_c)  # context tokens and locations [B, Nc, *]
            zt, xt = ca(zt, xt, zc, xc, mask_c)  # target tokens and locations [B, Nt, *]
        return self.head(self.decoder(zt))


#: The shipped te-pt-tnp (``geonp/weights/te-pt-tnp.safetensors``): the class's defaults and its
#: ``shipped`` preset, which :func:`geonp.models.build` takes when no preset is named, written out
#: so that a checkpoint's header names every value. Its inputs: time, rows, cols (a time step counts
#: as 2 units in the neighbour search: 16 cells) and three covariates in the kriging head (dineof,
#: spread, nugget: :mod:`geonp.tasks.history`), so ``dim_x = 6``.
SHIPPED = {
    "dim_model": 64, "num_heads": 4, "head_dim": 16, "num_layers": 3, "num_pseudo": 32, "dim_kernel_hidden": 32,
    "max_block_elems": 2**25, "min_scale": 1e-3,
    "local_attention": {"neighbours": 16, "weights": [2.0, 1.0, 1.0]},
    "kriging": {"neighbours": 64, "quadrant_dims": [1, 2], "covariates": 3, "slope_prior": "empirical",
                "nugget_input": True},
}
#: The TE-TNP paper's model (appendix F sizes), without geonp's local parts; ``small`` and ``tiny``
#: are its CPU sizes.
_PAPER = {"dim_model": 128, "num_heads": 8, "head_dim": 16, "num_layers": 5, "num_pseudo": 32, "dim_kernel_hidden": 128,
          "max_block_elems": DEFAULT_BLOCK_ELEMS, "local_attention": None, "kriging": None}


@register("te-pt-tnp", default="shipped",
          presets={"shipped": SHIPPED, "paper": _PAPER,
                   **{name: {**_PAPER, **sizes} for name, sizes in _presets(_PT, _TE).items()}})
class TEPTTNP(_TETransformerNP):
    """TE-PT-TNP (IST style) with pseudo-locations, and the local parts geonp adds to it.

    Pseudo-locations start as ``v_m = v0_m + sum_n psi(u_m, z_n) x_n`` (Eq. 11):
    an attention-weighted average of the context inputs, so they move with the
    data and the model stays translation equivariant. Each layer then runs TE
    cross-attention pseudo <- context, context <- pseudo, targets <- pseudo, with
    Eq. 10 location updates on the query side.

    Parts, each built from its arguments (the paper's model, preset ``paper``, has only the first
    and the last; the defaults are the shipped model, :data:`SHIPPED`):

    * the pseudo-token encoder above (``num_pseudo``, ``num_layers``, ...);
    * local attention (``local_attention``: ``{"neighbours": k, "weights": [w per location
      dimension]}``): in every layer each target also attends to its ``k`` nearest context points
      (``weights`` scale the location dimensions for "nearest"; None: 1 each),
      :class:`~geonp.models.local_attention.TELocalAttentionBlock`;
    * the local kriging head (``kriging``, a :class:`~geonp.models.local_kriging.KrigingConfig`
      mapping; needs local attention): kriging of each target from its nearest context points,
      with an exponential covariance the network predicts per target and an external drift on
      the last ``covariates`` inputs (:class:`~geonp.models.local_kriging.LocalKriging`). Its mean
      is the predicted mean; its mean and log variance join the target tokens, from which the
      decoder sets sigma;
    * the Gaussian likelihood (``min_scale``).

    Variants that lost (a learned gate or gain between decoder and kriging means, raw neighbour
    values beside the tokens, context-to-context local attention) were removed after commit 3ab7466;
    switches the shipped weights never set (attention without the distance prior or location
    updates, another kriging kernel, a trend in the head's drift, scaled ranges at inference) after
    commit fbc8402; their rows are in ``pipelines/results/accuracy_ablation.md`` and the wide-cloud
    and history pages.
    """

    def __init__(self, dim_x: int, dim_y: int, dim_model: int = SHIPPED["dim_model"],
                 num_heads: int = SHIPPED["num_heads"], head_dim: int = SHIPPED["head_dim"],
                 num_layers: int = SHIPPED["num_layers"], num_pseudo: int = SHIPPED["num_pseudo"],
                 dim_kernel_hidden: int = SHIPPED["dim_kernel_hidden"],
                 max_block_elems: int = SHIPPED["max_block_elems"], min_scale: float = SHIPPED["min_scale"],
                 local_attention: dict[str, Any] | None = SHIPPED["local_attention"],
                 kriging: dict[str, Any] | None = SHIPPED["kriging"]) -> None:
        super().__init__(dim_x, dim_y, dim_model, min_scale)
        if kriging is not None and local_attention is None:
            raise ValueError("the kriging head needs local attention (local_attention: {neighbours: k, ...})")
        head = None if kriging is None else KrigingConfig.from_dict(kriging, dim_x)
        # The last inputs may be covariates, not locations; they enter only the kriging head's
        # external drift, so the transformer, its weights and its equivariance are those of the
        # first dim_x - covariates inputs.
        self.kriging_covariates = self.covariate_inputs = 0 if head is None else head.covariates
        self.kriging_nugget_input = head is not None and head.nugget_input
        dim_x = dim_x - self.kriging_covariates  # the location inputs, from here on

        # The encoder: pseudo-tokens and their locations, TE cross-attention blocks.
        self.pseudo = nn.Parameter(torch.randn(num_pseudo, dim_model))  # u0 [M, Dz]
        self.pseudo_offset = nn.Parameter(torch.randn(num_pseudo, dim_x))  # v0 [M, Dx]
        self.init_q = nn.Linear(dim_model, dim_model, bias=False)  # psi's query/key maps
        self.init_k = nn.Linear(dim_model, dim_model, bias=False)
        # Eq. 10 location updates and the distance prior, always (the paper's exact form is the te-tnp
        # class's and the attention layer's switch, geonp.models.te_attention).
        args = (num_layers, dim_model, num_heads, head_dim, dim_x, dim_kernel_hidden, True, max_block_elems, True)
        self.to_pseudo, self.to_context, self.to_target = (self._te_blocks(*args) for _ in range(3))

        # Local attention: targets also attend to their k nearest context points, in every layer.
        self.num_neighbours, weights = _local_attention(local_attention, dim_x)
        self.register_buffer("neighbour_weights", None if weights is None
                             else torch.tensor(weights, dtype=torch.float32), persistent=False)
        self.target_local = None if self.num_neighbours == 0 else nn.ModuleList(
            TELocalAttentionBlock(dim_model, num_heads, head_dim, dim_x, dim_kernel_hidden, True,
                                  max_block_elems) for _ in range(num_layers))

        # The local kriging head (geonp.models.local_kriging).
        self.kriging_neighbours = 0 if head is None else head.neighbours
        self.kriging_quadrant_dims = None if head is None else head.quadrant_dims
        self.kriging = None
        if head is not None:
            self.kriging = LocalKriging(dim_model, dim_x, "exponential", weights, head.slope_prior)
            # Its mean and log variance join the target tokens (zero-initialised: a model grown
            # with the head keeps its sigma; its mean is the kriging mean from the start).
            self.kriging_in = nn.Linear(dim_y + 1, dim_model)
            nn.init.zeros_(self.kriging_in.weight)
            nn.init.zeros_(self.kriging_in.bias)

    def initial_pseudo_locations(self, zc: torch.Tensor, xc: torch.Tensor, mask_c: torch.Tensor) -> torch.Tensor:
        """Eq. 11: ``zc [B, Nc, Dz], xc [B, Nc, Dx] -> v [B, M, Dx]``."""
        q = self.init_q(self.pseudo)  # [M, Dz]
        k = self.init_k(zc)  # [B, Nc, Dz]
        logits = torch.einsum("md,bnd->bmn", q, k) / q.shape[-1] ** 0.5
        psi = logits.float().masked_fill(~mask_c[:, None, :], float("-inf")).softmax(-1)  # rows sum to 1
        return self.pseudo_offset + psi.to(xc.dtype) @ xc

    def predict(self, xc, yc, xt, mask_c, mask_t) -> Normal:
        return self._predict(xc, yc, xt, mask_c, mask_t, [None])[0]

    def predict_per_nugget(self, xc: torch.Tensor, yc: torch.Tensor, xt: torch.Tensor, mask_c: torch.Tensor | None,
                           mask_t: torch.Tensor | None, nuggets: list[float | None]) -> list[Normal]:
        """One prediction per entry of ``nuggets``: the targets' nugget share (the last input,
        ``kriging.nugget_input``) as ``xt`` gives it (``None``) or set to that number everywhere.

        Equal to calling the model once per entry with ``xt[..., -1]`` changed, at the cost of one
        call: only the kriging head reads the nugget, so the transformer runs once and the head once
        per entry (the nugget check of :mod:`geonp.fill.nugget` compares two). Shapes as the
        model's call (``NeuralProcess.forward``); each ``Normal`` has ``loc``/``scale`` ``[B, Nt, Dy]``.
        """
        if not self.kriging_nugget_input:
            raise ValueError("predict_per_nugget needs a model that takes the nugget (kriging nugget_input)")
        xc, yc, xt, mask_c, mask_t = check_inputs(self, xc, yc, xt, mask_c, mask_t)
        return self._predict(xc, yc, xt, mask_c, mask_t, nuggets)

    def _predict(self, xc, yc, xt, mask_c, mask_t, nuggets: list[float | None]) -> list[Normal]:
        drift_c = drift_t = None
        if self.kriging_covariates:  # [B, N, Dx] -> locations [B, N, Dx - P], covariates [B, N, P]
            split = xc.shape[-1] - self.kriging_covariates
            xc, drift_c = xc[..., :split], xc[..., split:]
            xt, drift_t = xt[..., :split], xt[..., split:]
        nugget_t = None
        if self.kriging_nugget_input:  # [B, Nt, P] -> drift [B, Nt, P - 1], the targets' nugget share [B, Nt]
            nugget_t, drift_t, drift_c = drift_t[..., -1], drift_t[..., :-1], drift_c[..., :-1]
            if drift_t.shape[-1] == 0:
                drift_t = drift_c = None
        near_t, near_k = self._neighbourhoods(xc, xt, mask_c)  # each ([B, Nt, K] indices, mask) or None
        zt = self._encode(xc, yc, xt, mask_c, near_t, mask_t)  # [B, Nt, Dz]
        if self.kriging is None:
            return [self.head(self.decoder(zt))]
        return [self._kriging_head(zt, xc, yc, xt, near_k, drift_c, drift_t, mask_t,
                                   nugget_t if share is None else torch.full_like(nugget_t, share))
                for share in nuggets]

    def _neighbourhoods(self, xc: torch.Tensor, xt: torch.Tensor, mask_c: torch.Tensor) -> tuple:
        """The targets' nearest context points for local attention and for the kriging head,
        chosen once from the input locations (before Eq. 10 moves them), nearest first."""
        if self.target_local is None:
            return None, None
        by_quadrant = self.kriging is not None and self.kriging_quadrant_dims is not None
        k = max(self.num_neighbours, self.kriging_neighbours if self.kriging is not None and not by_quadrant else 0)
        near = nearest_neighbours(xt, xc, mask_c, k, self.neighbour_weights)  # [B, Nt, K]
        near_t = tuple(t[..., :self.num_neighbours] for t in near)
        if by_quadrant:
            near = nearest_neighbours(xt, xc, mask_c, self.kriging_neighbours, self.neighbour_weights,
                                      self.kriging_quadrant_dims)  # [B, Nt, K]
        return near_t, tuple(t[..., :self.kriging_neighbours] for t in near)

    def _encode(self, xc: torch.Tensor, yc: torch.Tensor, xt: torch.Tensor, mask_c: torch.Tensor,
                near_t: tuple | None, mask_t: torch.Tensor | None = None) -> torch.Tensor:
        """Target tokens ``[B, Nt, Dz]``: the pseudo-token layers, each followed by local attention.
        Padded context rows, and target rows where ``mask_t`` is False, are skipped by the fused
        kernel (their tokens reach no valid output: keys are masked, later steps work row by row)."""
        zc, zt = self._tokens(yc, xt)  # [B, Nc, Dz], [B, Nt, Dz]
        u = self.pseudo.expand(xc.shape[0], -1, -1)  # [B, M, Dz]
        v = self.initial_pseudo_locations(zc, xc, mask_c)  # [B, M, Dx]
        all_u = torch.ones(u.shape[:2], dtype=torch.bool, device=u.device)
        last = len(self.to_pseudo) - 1
        for i, (to_u, to_c, to_t) in enumerate(zip(self.to_pseudo, self.to_context, self.to_target)):
            u, v = to_u(u, v, zc, xc, mask_c)
            # The last layer's context tokens reach the result only as some target's neighbours
            # (none without local attention): the fused kernel computes just those rows and skips
            # the others like padding. (to_c runs before to_t in every layer: the order in which
            # autograd sums the gradients u and v receive, which training's rounding follows.)
            wanted_c = mask_c
            if i == last:
                wanted_c = mask_c & rows_reached(*near_t, zc.shape[1], mask_t) if near_t is not None else None
            if wanted_c is not None:
                zc, xc = to_c(zc, xc, u, v, all_u, wanted_c)
            zt, xt = to_t(zt, xt, u, v, all_u, mask_t)
            if near_t is not None:
                zt = self.target_local[i](zt, xt, zc, xc, *near_t, mask_t)
        return zt

    def _kriging_head(self, zt: torch.Tensor, xc: torch.Tensor, yc: torch.Tensor, xt: torch.Tensor,
                      near: tuple, drift_c: torch.Tensor | None, drift_t: torch.Tensor | None,
                      mask_t: torch.Tensor | None = None, nugget_t: torch.Tensor | None = None) -> Normal:
        """The kriging mean as the predicted mean; sigma from tokens that carry the kriging mean and
        variance. ``xc``/``xt`` are the input locations (``[B, N, Dx]``), not the moved ones;
        ``nugget_t [B, Nt]``: each target's nugget share (None: the network's own)."""
        # [B, Nt, Dy], [B, Nt, 1]
        k_mean, k_logvar = self.kriging(zt, xt, xc, yc, *near, drift_t, drift_c, mask_t, nugget_t)
        raw = self.decoder(zt + self.kriging_in(torch.cat([k_mean, k_logvar], -1).to(zt.dtype)))
        _, pre_scale = raw.float().split(self.dim_y, dim=-1)
        return self.head(torch.cat([k_mean.float(), pre_scale], -1))
