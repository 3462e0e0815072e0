"""Variants of a shipped model that lost, and what they left behind in checkpoints and configs.

A shipped model carries only the parts that won: variants live in configs and the ablation
table, not as flags of the shipped class. Checkpoints and configs written while a
variant was still a flag may still name it: where they name the value the shipped model computes
with, the argument is dropped (and weights the retired part held, unused, are left out on
loading), so they load and resume unchanged; where they name a retired value, they are refused
with one line saying at which commit the variant last existed (its rows stay in
``pipelines/results/accuracy_ablation.md``).
"""

from __future__ import annotations

from typing import Any

#: model -> {argument: (the value the shipped model computes with, the last commit that had it,
#: why it went)}.
RETIRED_ARGS: dict[str, dict[str, tuple[Any, str, str]]] = {
    "te-pt-tnp": {
        "kriging_mix": ("kriging", "3ab7466", "the predicted mean is the local kriging head's (issue #13 chose it "
                        "over a learned gate and a learned gain on the validation crops)"),
        "value_skip": (False, "3ab7466", "the neighbours' raw values beside the tokens lost to the kriging head"),
        "local_context": (False, "3ab7466", "context-to-context local attention was never chosen"),
    },
}

#: model -> weight names a retired part held, dropped when a checkpoint is loaded.
RETIRED_WEIGHTS: dict[str, tuple[str, ...]] = {
    # Only the gate: a gain model (kriging_mix: gain) is refused before its weights are read.
    "te-pt-tnp": ("kriging_gate.weight", "kriging_gate.bias"),
}


def without_retired(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Build arguments with the retired ones that ask for the shipped behaviour left out.

    Args:
        name: the registered model name.
        kwargs: its build arguments, as a config or a checkpoint header records them.

    Returns:
        A copy of ``kwargs`` without those arguments.

    Raises:
        ValueError: an argument asks for a retired variant.
    """
    retired = RETIRED_ARGS.get(name, {})
    for key, value in kwargs.items():
        if key in retired and value != retired[key][0]:
            shipped, commit, why = retired[key]
            raise ValueError(f"model {name!r}: {key}={value!r} is a retired variant ({why}); the model now "
                             f"computes as {key}={shipped!r}; check out commit {commit} to run the variant")
    return {k: v for k, v in kwargs.items() if k not in retired}


def drop_retired_weights(name: str, recorded: dict[str, Any], state: dict[str, Any], where: str) -> dict[str, Any]:
    """A checkpoint's weights without those of retired parts.

    Args:
        name: the registered model name.
        recorded: the build arguments the checkpoint's header records (before :func:`without_retired`).
        state: ``{weight name: tensor}``.
        where: the checkpoint, for the error message.

    Returns:
        ``state`` without the retired weights.

    Raises:
        ValueError: a te-pt-tnp checkpoint with a kriging gate that does not record
            ``kriging_mix: kriging`` was trained with the gate (the old default): its mean is not
            the shipped model's.
    """
    names = RETIRED_WEIGHTS.get(name, ())
    if name == "te-pt-tnp" and "kriging_gate.weight" in state and recorded.get("kriging_mix") != "kriging":
        commit = RETIRED_ARGS[name]["kriging_mix"][1]
        raise ValueError(f"checkpoint {where}: a te-pt-tnp with a gated kriging mean (kriging_mix: gate, the default "
                         f"before it was retired), a retired variant; check out commit {commit} to use it")
    return {k: v for k, v in state.items() if k not in names}
