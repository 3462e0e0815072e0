"""geonp's compiled CPU kernels: C++ sources under ``kernels/``, built on first use.

Four kernels: ``te_attention`` (the fused TE attention of :mod:`geonp.models.te_fused`),
``spd`` (the local kriging head's many small positive definite solves,
:mod:`geonp.models.kriging_linalg`), ``covariance`` (those systems' covariance matrices and
their gradients, the same module) and ``neighbours`` (each query's nearest keys, overall or by
quadrant, :func:`geonp.models.local_attention.nearest_neighbours`). Each is compiled with
``torch.utils.cpp_extension`` the first time a process asks for it (needs a C++ compiler and
``ninja``), cached under ``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``), and
announced on stderr when a build is coming: the first takes up to a minute, later processes load
it in a second. Where a kernel cannot be built :func:`kernel` returns None and its caller keeps
its PyTorch path: same function, slower.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType

import torch

#: The kernels, by name: their source under ``kernels/``, what the build note calls them and
#: flags of their own (the neighbour search rounds each squared offset as PyTorch does).
KERNELS = {
    "te_attention": ("te_attention_cpu.cpp", "the fused TE attention kernel", []),
    "spd": ("spd_cpu.cpp", "the kriging head's solver kernel", []),
    "covariance": ("covariance_cpu.cpp", "the kriging head's covariance kernel", []),
    "neighbours": ("neighbours_cpu.cpp", "the neighbour search kernel", ["-ffp-contract=off"]),
}
_FOLDER = Path(__file__).with_name("kernels")


def source(name: str) -> Path:
    """The C++ source of kernel ``name`` (a key of :data:`KERNELS`)."""
    return _FOLDER / KERNELS[name][0]


#: Added to the fused TE kernel's flags on a CPU with AVX-512: two of its loops then run 16 floats
#: wide, the rest stays AVX2 code (``kernels/te_attention_loops.h``; the same floats either way).
AVX512 = "-DGEONP_AVX512"


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_flags() -> list[str]:
    """Optimisation flags: AVX2 + FMA code where this CPU has them (a cache per flag set, so a
    shared home directory on mixed nodes never hands one CPU another's build)."""
    # No trapping math: lets the compiler vectorise the kernels' exp (floor must not raise).
    flags = ["-O3", "-fopenmp", "-fno-trapping-math", "-fno-math-errno"]
    info = _cpuinfo()
    if " avx2" in info and " fma" in info:
        flags += ["-mavx2", "-mfma"]
    return flags


def has_avx512() -> bool:
    """Whether this CPU has AVX2, FMA and AVX-512F: the fused TE kernel is then built with :data:`AVX512`."""
    return "-mavx2" in cpu_flags() and " avx512f" in _cpuinfo()


def built_before(extension: str) -> bool:
    """Whether a build of ``extension`` is cached, so loading it takes a second, not a minute.

    Looks where ``torch.utils.cpp_extension`` keeps builds: ``TORCH_EXTENSIONS_DIR/extension``,
    else a folder per Python and accelerator under the default root. A cached build of older
    source is rebuilt all the same; this only decides whether to say that a build is coming."""
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    pattern = f"{extension}/{extension}.so" if root else f"*/{extension}/{extension}.so"
    return any(Path(root or get_default_build_root()).glob(pattern))


def kernel_name(name: str, flags: list[str], path: Path | None = None) -> str:
    """The extension's name, which is its cache folder: one build per kernel, CPU flag set, source
    (its text, the headers beside it, and where it lies), torch and Python environment. torch's cache is shared by every
    virtual environment of an account; a name without the environment in it had another venv's
    torch rebuild the kernel silently (the announcement goes by the name), and two venvs take
    turns rebuilding it. The same holds for two checkouts sharing one environment: torch's build
    file names the source by path, so a name without the path had each checkout rebuild the
    other's kernel, silently, 30-40 s on the first call of every run."""
    path = path or source(name)
    headers = [h.read_text() for h in sorted(path.parent.glob("*.h"))]  # what the source may include
    key = "|".join([path.read_text(), *headers, str(path.resolve()), torch.__version__, sys.prefix, *flags])
    isa = ("_avx512" if AVX512 in flags else "_avx2") if "-mavx2" in flags else ""
    return f"geonp_{name}_cpu{isa}_" + \
        hashlib.sha256(key.encode()).hexdigest()[:10]


def load_kernel(name: str, flags: list[str], warn: bool = True) -> ModuleType | None:
    """Kernel ``name`` built with compiler ``flags`` (cached by :func:`kernel_name`), or None
    where it cannot be built (with a warning unless ``warn`` is False). :func:`kernel` asks for this
    CPU's flags; a build without ``-mavx2`` runs a kernel's portable loops instead of its AVX2 code
    (tests compare the two)."""
    extension = kernel_name(name, flags)
    try:
        from torch.utils.cpp_extension import load

        if not built_before(extension):  # the first fill on a machine would otherwise sit silent for ~40 s
            print(f"geonp: note: building {KERNELS[name][1]} for this CPU, once (up to a minute; then cached)",
                  file=sys.stderr, flush=True)
        return load(extension, [str(source(name))], extra_cflags=flags, extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as err:  # no compiler, no ninja, a failed build: the PyTorch path still works
        if not warn:
            return None
        warnings.warn(f"geonp: {KERNELS[name][1]} unavailable ({type(err).__name__}: "
                      f"{str(err).splitlines()[0] if str(err) else ''}); using the slower PyTorch path",
                      stacklevel=2)
        return None


@functools.cache
def kernel(name: str) -> ModuleType | None:
    """Kernel ``name`` (a key of :data:`KERNELS`) for this CPU, built or loaded once per process,
    or None (no compiler, no ninja, a failed build). The fused TE kernel is built with its AVX-512
    loops where the CPU has them, and without them where that build fails (an older compiler)."""
    flags = kernel_flags(name)
    if AVX512 in flags:
        built = load_kernel(name, flags, warn=False)
        if built is not None:
            return built
        flags = [f for f in flags if f != AVX512]
    return load_kernel(name, flags)


def kernel_flags(name: str) -> list[str]:
    """The flags :func:`kernel` builds kernel ``name`` with first on this CPU: :func:`cpu_flags`,
    the kernel's own, and :data:`AVX512` for the fused TE kernel on a CPU with AVX-512."""
    return cpu_flags() + KERNELS[name][2] + ([AVX512] if name == "te_attention" and has_avx512() else [])


def can_build() -> bool:
    """Whether a C++ compiler and ``ninja`` are here (a kernel may still fail to build)."""
    import importlib.util
    import shutil

    return shutil.which("c++") is not None and importlib.util.find_spec("ninja") is not None


def build_all() -> None:
    """Build (or load) every kernel now: benchmarks call it so a one-time build is not timed."""
    for name in KERNELS:
        kernel(name)
