"""Packages gravac's Python sources with libgravac_c.so.1 (pyproject.toml holds the metadata).

The library is the CMake target gravac_c, built in build/pip-gravac_c (only that target and
the runtime it links: no tests, benchmarks or examples), or the file named by the
environment variable GRAVAC_C_PREBUILT (nothing is compiled). The wheel is tagged
py3-none-<platform>: it holds a native library but links no Python.
"""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

try:  # setuptools >= 70.1 has the command; older ones (Debian 12: 66) take it from wheel
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:  # pragma: no cover - without wheel only sdists and builds are possible
        bdist_wheel = None

ROOT = os.path.dirname(os.path.abspath(__file__))
LIBRARY = "libgravac_c.so.1"


def _built_library():
    prebuilt = os.environ.get("GRAVAC_C_PREBUILT")
    if prebuilt:
        if not os.path.isfile(prebuilt):
            raise SystemExit(f"setup.py: GRAVAC_C_PREBUILT={prebuilt} is not a file")
        return os.path.realpath(prebuilt)
    build = os.environ.get("GRAVAC_C_BUILD_DIR", os.path.join(ROOT, "build", "pip-gravac_c"))
    configure = ["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DGRAVAC_BUILD_TESTS=OFF",
                 "-DGRAVAC_BUILD_BENCHMARKS=OFF", "-DGRAVAC_BUILD_EXAMPLES=OFF", "-DGRAVAC_BUILD_PYTHON=OFF",
                 "-DGRAVAC_ENABLE_MPI=OFF",
                 # Where nvcc is found the library gets its CUDA path (CUDA gradients compressed on
                 # the device), with the CUDA runtime linked statically: the library then loads on
                 # machines without CUDA and needs no libcudart beside it (only the driver, on a GPU).
                 # GRAVAC_C_CUDA=0 leaves the CUDA path out.
                 "-DGRAVAC_C_CUDA=" + ("OFF" if os.environ.get("GRAVAC_C_CUDA") == "0" else "ON"),
                 "-DGRAVAC_CUDART_STATIC=ON"]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    subprocess.check_call(configure)
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2")
    subprocess.check_call(["cmake", "--build", build, "--target", "gravac_c", "--parallel", jobs])
    staged = os.path.join(build, "python-component")
    subprocess.check_call(["cmake", "--install", build, "--component", "python", "--prefix", staged])
    path = os.path.join(staged, "gravac", LIBRARY)
    if not os.path.isfile(path):
        raise SystemExit(f"setup.py: the build did not install {path} (is Eigen installed? libeigen3-dev)")
    return path


class BuildPy(build_py):
    """The sources, and the library beside them as gravac/libgravac_c.so.1."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "gravac", LIBRARY)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(_built_library(), target)
        os.chmod(target, 0o755)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # a platform wheel (platlib), though nothing links Python
        return True


commands = {"build_py": BuildPy}
if bdist_wheel is not None:
    class BdistWheel(bdist_wheel):
        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            _, _, platform = super().get_tag()
            return "py3", "none", platform

    commands["bdist_wheel"] = BdistWheel

# setuptools' files (metadata, staging) go to build/pip-setuptools, not beside the sources.
BUILD_BASE = os.path.join(ROOT, "build", "pip-setuptools")
os.makedirs(BUILD_BASE, exist_ok=True)
setup(cmdclass=commands, distclass=BinaryDistribution,
      options={"egg_info": {"egg_base": BUILD_BASE}, "build": {"build_base": BUILD_BASE}})
