# gravac_extract_code_blocks(<markdown file> <name shown in messages> <output dir> <prefix>)
#
# Writes every ```cpp (or ```c++) block of a Markdown guide to a C++ source of its own
# under <output dir>, preceded by a #line directive, so that a compiler error names the
# guide and the line of the block (docs/getting_started.md:57), not a generated file.
#
# A block whose fence is directly preceded by the line `<!-- continued -->` is appended
# to the previous block of the same guide (one translation unit), so a guide can define
# a class, explain it, and use it in a later block. Fences of other languages are
# skipped whole (a ```cpp inside a ```markdown block is not code).
#
# Results, in the caller's scope:
#   <prefix>_UNITS             the units found, in order (names usable as target names)
#   <prefix>_<unit>_SOURCE     the generated source
#   <prefix>_<unit>_WHERE      "<name>:<line>" of the unit's first block
#   <prefix>_<unit>_PROGRAM    TRUE when the unit defines `int main` (link and run it)
#   <prefix>_<unit>_INCLUDES   the gravac headers it includes (to pick the targets to link)
# A fence left open is a fatal error naming the guide and the line of the fence.
function(gravac_extract_code_blocks md shown out_dir prefix)
  file(READ "${md}" text)
  # CMake lists split at ';' (unless escaped by '\' or inside '[ ]'), and C++ is full of
  # all three: hide them while the text is a list of lines, restore them in the output.
  string(REPLACE "\\" "@GRAVAC_BS@" text "${text}")
  string(REPLACE ";" "@GRAVAC_SC@" text "${text}")
  string(REPLACE "[" "@GRAVAC_LB@" text "${text}")
  string(REPLACE "]" "@GRAVAC_RB@" text "${text}")
  string(REPLACE "\n" ";" lines "${text}")

  get_filename_component(stem "${md}" NAME_WE)
  string(MAKE_C_IDENTIFIER "${stem}" stem)
  set(units "")
  set(state outside)   # outside, cpp (inside a C++ block), other (inside another fence)
  set(lineno 0)
  set(previous "")
  set(unit "")
  foreach(line IN LISTS lines)
    math(EXPR lineno "${lineno} + 1")
    if(state STREQUAL "outside")
      if(line MATCHES "^( *)```(cpp|c\\+\\+)[ \t]*$")
        string(LENGTH "${CMAKE_MATCH_1}" indent)
        math(EXPR first "${lineno} + 1")
        set(fence_line ${lineno})
        string(STRIP "${previous}" marker)
        if(marker STREQUAL "<!-- continued -->" AND NOT unit STREQUAL "")
          string(APPEND code_${unit} "#line ${first} \"${shown}\"\n")
        else()
          set(unit "${stem}_${first}")
          list(APPEND units ${unit})
          set(where_${unit} "${shown}:${first}")
          set(code_${unit} "#line ${first} \"${shown}\"\n")
        endif()
        set(state cpp)
      elseif(line MATCHES "^ *```")
        set(fence_line ${lineno})
        set(state other)
      endif()
    elseif(state STREQUAL "cpp")
      if(line MATCHES "^ *```[ \t]*$")
        set(state outside)
      else()
        # The fence's indentation is not part of the code.
        if(indent GREATER 0 AND line MATCHES "^ +")
          string(SUBSTRING "${line}" ${indent} -1 line)
        endif()
        string(APPEND code_${unit} "${line}\n")
      endif()
    elseif(line MATCHES "^ *```[ \t]*$")
      set(state outside)
    endif()
    set(previous "${line}")
  endforeach()
  if(NOT state STREQUAL "outside")
    message(FATAL_ERROR "${shown}:${fence_line}: a code fence is never closed")
  endif()

  file(MAKE_DIRECTORY "${out_dir}")
  foreach(u IN LISTS units)
    set(code "${code_${u}}")
    string(REPLACE "@GRAVAC_RB@" "]" code "${code}")
    string(REPLACE "@GRAVAC_LB@" "[" code "${code}")
    string(REPLACE "@GRAVAC_SC@" ";" code "${code}")
    string(REPLACE "@GRAVAC_BS@" "\\" code "${code}")
    set(src "${out_dir}/${u}.cpp")
    # Rewrite only what changed, so an unchanged block is not compiled again.
    set(old "")
    if(EXISTS "${src}")
      file(READ "${src}" old)
    endif()
    if(NOT old STREQUAL code)
      file(WRITE "${src}" "${code}")
    endif()
    set(program FALSE)
    if(code MATCHES "(^|\n)[ \t]*int[ \t]+main[ \t]*\\(")
      set(program TRUE)
    endif()
    string(REGEX MATCHALL "#[ \t]*include[ \t]*[<\"]gravac/[^>\"]+" incs "${code}")
    list(TRANSFORM incs REPLACE "^#[ \t]*include[ \t]*[<\"]" "")
    set(${prefix}_${u}_SOURCE "${src}" PARENT_SCOPE)
    set(${prefix}_${u}_WHERE "${where_${u}}" PARENT_SCOPE)
    set(${prefix}_${u}_PROGRAM ${program} PARENT_SCOPE)
    set(${prefix}_${u}_INCLUDES "${incs}" PARENT_SCOPE)
  endforeach()
  set(${prefix}_UNITS "${units}" PARENT_SCOPE)
endfunction()
