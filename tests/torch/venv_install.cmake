# `pip install` of the Python package into a fresh virtual environment, offline (CTest
# test_python_venv_install):
#   cmake -DPYTHON=<python3> -DSOURCE_DIR=<repo> -DLIBRARY=<libgravac_c.so.1> -DWORK_DIR=<dir> -P venv_install.cmake
# A copy of the package's sources (pyproject.toml, setup.py, python/gravac) is made into a
# wheel by setuptools with GRAVAC_C_PREBUILT=<LIBRARY> (nothing is compiled, no network:
# --no-build-isolation --no-index), the wheel must be tagged py3-none-<platform>, and it is
# installed into a venv made with --system-site-packages (for the system's torch, setuptools
# and wheel: Debian's python3-torch, python3-setuptools, python3-wheel). The installed
# package must then load its own library and refuse bad arguments (ddp_hook_checks.py
# bad_input on 2 Gloo processes). Skipped without venv or wheel.
foreach(v PYTHON SOURCE_DIR LIBRARY WORK_DIR)
  if(NOT ${v})
    message(FATAL_ERROR "venv_install.cmake: -D${v}= is required")
  endif()
endforeach()

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "venv_install: ${what} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "venv_install: ${what}: ok")
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

execute_process(COMMAND ${PYTHON} -c "import venv, ensurepip, setuptools, wheel" RESULT_VARIABLE rc ERROR_QUIET)
if(NOT rc EQUAL 0)
  # CTest reports the test Skipped on this line (SKIP_REGULAR_EXPRESSION).
  message(FATAL_ERROR "venv_install: skipped: ${PYTHON} lacks venv, ensurepip, setuptools or wheel "
                      "(Debian: python3-venv python3-setuptools python3-wheel)")
endif()

file(REMOVE_RECURSE ${WORK_DIR})
set(src ${WORK_DIR}/src)
file(MAKE_DIRECTORY ${src}/python ${src}/docs)
file(COPY ${SOURCE_DIR}/pyproject.toml ${SOURCE_DIR}/setup.py ${SOURCE_DIR}/LICENSE DESTINATION ${src})
file(COPY ${SOURCE_DIR}/docs/pytorch.md DESTINATION ${src}/docs)
file(COPY ${SOURCE_DIR}/python/gravac DESTINATION ${src}/python PATTERN __pycache__ EXCLUDE)

set(ENV{GRAVAC_C_PREBUILT} ${LIBRARY})
set(ENV{PIP_DISABLE_PIP_VERSION_CHECK} 1)
unset(ENV{PYTHONPATH})
unset(ENV{GRAVAC_C_LIBRARY})
run("pip wheel" ${PYTHON} -m pip wheel --no-build-isolation --no-index --no-deps -w ${WORK_DIR}/dist ${src})
file(GLOB wheels ${WORK_DIR}/dist/gravac-*.whl)
list(LENGTH wheels n)
if(NOT n EQUAL 1 OR NOT wheels MATCHES "gravac-[0-9.]+-py3-none-linux_[a-z0-9_]+\\.whl$")
  message(FATAL_ERROR "venv_install: expected one wheel gravac-*-py3-none-linux_*.whl, got '${wheels}'")
endif()
message(STATUS "venv_install: ${wheels}")

run("venv" ${PYTHON} -m venv --system-site-packages ${WORK_DIR}/venv)
set(vpy ${WORK_DIR}/venv/bin/python)
run("pip install" ${vpy} -m pip install --no-index --no-deps ${wheels})

# From a directory without the sources: the installed package, with its own library.
file(WRITE ${WORK_DIR}/import_check.py [[
import os, sys, gravac, gravac.torch, torch
here = os.path.dirname(gravac.__file__)
assert here.startswith(sys.prefix), (here, sys.prefix)
assert gravac.library_path() == os.path.join(here, "libgravac_c.so.1"), gravac.library_path()
opts = gravac.options()
assert opts and {"name", "type", "range", "default", "doc"} <= set(opts[0]), opts[:1]
assert [o["name"] for o in opts] == gravac.torch.option_names()
assert "recommended" in gravac.torch.presets(), gravac.torch.presets()
print("gravac", gravac.__version__, "library", gravac.library_version(), "torch", torch.__version__,
      "python", sys.version.split()[0], len(opts), "options")
]])
run("import" ${CMAKE_COMMAND} -E chdir ${WORK_DIR} ${vpy} ${WORK_DIR}/import_check.py)
message(STATUS "venv_install: ${last_output}")
run("ddp_hook_checks bad_input" ${CMAKE_COMMAND} -E chdir ${WORK_DIR}
    ${vpy} ${SOURCE_DIR}/tests/torch/ddp_hook_checks.py --ranks 2 bad_input)
message(STATUS "venv_install: passed")
