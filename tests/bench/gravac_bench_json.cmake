# gravac-bench on a tiny layout: the JSON record parses and holds the fields a user reads,
# with sane values; wrong input (an unknown compressor, a truncated gradient file, a .npy
# of the wrong dtype) exits non-zero with a message that says what is wrong.
# Run as: cmake -DTOOL=<gravac-bench> -DSAMPLE=<.npy> -DWORK=<dir> -P gravac_bench_json.cmake
file(MAKE_DIRECTORY ${WORK})

function(run_tool out_var)
  execute_process(COMMAND ${TOOL} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "gravac-bench ${ARGN} failed (${rc}): ${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

function(expect_field json key)
  string(JSON v ERROR_VARIABLE e GET "${json}" ${key})
  if(e)
    message(FATAL_ERROR "JSON has no '${key}': ${e}\n${json}")
  endif()
endfunction()

function(expect_positive json key)
  string(JSON v GET "${json}" ${key})
  if(NOT v GREATER 0)
    message(FATAL_ERROR "'${key}' is ${v}, expected > 0\n${json}")
  endif()
endfunction()

foreach(mode --dynamic --restored)
  foreach(comp topk threshold qsgd sign)
    run_tool(out --compressor ${comp} --layout 1000,3000,12000 --fraction 0.01 --steps 3 --max-warmup 40 ${mode} --json)
    foreach(key compressor n layers fraction threads data mode steady warmup_steps samples ms_per_step ratio_to_memcpy
                ratio_to_ef_floor ef_floor_to_memcpy bits_per_element)
      expect_field("${out}" ${key})
    endforeach()
    foreach(key ms_per_step ratio_to_memcpy ratio_to_ef_floor bits_per_element)
      expect_positive("${out}" ${key})
    endforeach()
    string(JSON n GET "${out}" n)
    string(JSON layers LENGTH "${out}" layers)
    if(NOT n EQUAL 16000 OR NOT layers EQUAL 3)
      message(FATAL_ERROR "n ${n} in ${layers} layers, expected 16000 in 3\n${out}")
    endif()
  endforeach()
endforeach()

# Recorded gradients (the checked-in sample) and the text output.
run_tool(out --compressor topk --n 20000 --data ${SAMPLE} --steps 3 --max-warmup 40)
foreach(line "time per step" "/ memcpy" "/ error-feedback floor" "bits per element")
  string(FIND "${out}" "${line}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the text output has no '${line}':\n${out}")
  endif()
endforeach()

function(expect_failure regex)
  execute_process(COMMAND ${TOOL} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0)
    message(FATAL_ERROR "gravac-bench ${ARGN} succeeded, expected a failure matching '${regex}'")
  endif()
  if(NOT err MATCHES "${regex}")
    message(FATAL_ERROR "gravac-bench ${ARGN}: the error '${err}' does not match '${regex}'")
  endif()
endfunction()

expect_failure("unknown compressor 'nope' \\(known: topk" --compressor nope --n 1000)
expect_failure("--fraction: 'abc' is not a number" --compressor topk --fraction abc)
# Raw float32 data of a length that is not whole floats, or not whole rows of the layout
# (the .npy cases, truncated data and wrong dtype or shape, are test_bench_support's).
file(WRITE ${WORK}/odd.raw "abcdefg")
expect_failure("multiple of 4 bytes" --compressor topk --n 1000 --data ${WORK}/odd.raw)
file(WRITE ${WORK}/rows.raw "abcdefghijkl")
expect_failure("not whole rows of 2" --compressor topk --layout 1,1 --data ${WORK}/rows.raw)
