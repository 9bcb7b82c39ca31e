# Warnings as errors on our own code only (third-party headers come in as SYSTEM).
# The fuzz flavour's clang keeps the warnings but not as errors: g++ is the compiler they are
# kept clean for.
function(rtable_compile_options target)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    target_compile_options(${target} PRIVATE -Wall -Wextra)
  else()
    target_compile_options(${target} PRIVATE -Wall -Wextra -Werror)
  endif()
endfunction()

# Unity builds (RTABLE_UNITY, on unless configured off): each target's .cpp files compile in
# batches of up to 8, one translation unit per batch. Most of an object's time here is the same
# headers (nlohmann/json, fmt, gtest, the component's own) parsed and their templates instantiated
# again in every file; a batch pays once. Measured: a target's batch of 8 files compiles in 30 to
# 60 % of the files' separate time, and CI builds every object of three flavours on a cold machine
# (docs/development.md). CMake's own UNITY_BUILD includes the sources by absolute path, which ties
# every object to the clone's folder and so defeats the compiler cache across clones (CI's fresh
# clone); these batches include them by a path relative to the batch, the same in every clone.
option(RTABLE_UNITY "Compile each target's sources in batches of 8 (unity builds)" ON)
if(RTABLE_UNITY AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  # GCC takes a .cpp included by a batch for a header and warns on its classes with members of
  # an anonymous-namespace type; in a unity build they stay in one translation unit as before.
  add_compile_options(-Wno-subobject-linkage)
endif()

function(rtable_unity target)
  if(NOT RTABLE_UNITY)
    return()
  endif()
  get_target_property(sources ${target} SOURCES)
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/unity)
  set(cpp)
  foreach(source IN LISTS sources)
    if(source MATCHES "\\.cpp$")
      get_filename_component(path ${source} ABSOLUTE BASE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
      list(APPEND cpp ${path})
    endif()
  endforeach()
  list(LENGTH cpp count)
  if(count LESS 2)
    return()
  endif()
  set(batches)
  set(content "")
  set(in_batch 0)
  set(index 0)
  foreach(path IN LISTS cpp)
    file(RELATIVE_PATH relative ${dir} ${path})
    string(APPEND content "#include \"${relative}\"\n")
    math(EXPR in_batch "${in_batch} + 1")
    if(in_batch EQUAL 8)
      # Written only when changed, so that a reconfigure does not recompile every batch.
      file(CONFIGURE OUTPUT ${dir}/${target}_${index}.cpp CONTENT "${content}" @ONLY)
      list(APPEND batches ${dir}/${target}_${index}.cpp)
      math(EXPR index "${index} + 1")
      set(content "")
      set(in_batch 0)
    endif()
  endforeach()
  if(in_batch GREATER 0)
    file(CONFIGURE OUTPUT ${dir}/${target}_${index}.cpp CONTENT "${content}" @ONLY)
    list(APPEND batches ${dir}/${target}_${index}.cpp)
  endif()
  set_source_files_properties(${cpp} PROPERTIES HEADER_FILE_ONLY ON)
  target_sources(${target} PRIVATE ${batches})
endfunction()

# rtable_library(<name> SOURCES ... [PUBLIC_DEPS ...] [PRIVATE_DEPS ...])
# One component library: target rtable_<name>, alias rtable::<name>, public headers in include/.
function(rtable_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(rtable_${name} ${ARG_SOURCES})
  add_library(rtable::${name} ALIAS rtable_${name})
  target_include_directories(rtable_${name} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include)
  target_link_libraries(rtable_${name} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  rtable_compile_options(rtable_${name})
  rtable_unity(rtable_${name})
endfunction()

# rtable_test(<name> SOURCES ... DEPS ... [LABELS ...] [TIMEOUT s] [RELEASE_ONLY])
# One ctest test per binary, so an integration binary starts its real servers once for all its
# cases. Labels: unit (in-memory fakes), integration (real servers and processes).
# RELEASE_ONLY: a test of what lies outside rtable's runtime code (the CRD schemas in a real
# apiserver, the test control plane's launcher, formats against ClickHouse's), whose run under a
# sanitizer would only cost CI time: neither built nor run in the ASan and TSan flavours.
function(rtable_test name)
  cmake_parse_arguments(ARG "RELEASE_ONLY" "TIMEOUT;LOCK" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  rtable_compile_options(${name})
  rtable_unity(${name})
  if(ARG_RELEASE_ONLY AND (RTABLE_SANITIZE OR RTABLE_TSAN))
    # Still defined, so that the caller's later settings on it apply.
    set_target_properties(${name} PROPERTIES EXCLUDE_FROM_ALL TRUE)
    return()
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT})
  if(ARG_LOCK)
    # Tests holding one lock never run at once under ctest -j (e.g. test kubelets, which all
    # hand out pod addresses from 127.0.0.2 up with fixed ports).
    set_tests_properties(${name} PROPERTIES RESOURCE_LOCK ${ARG_LOCK})
  endif()
endfunction()
