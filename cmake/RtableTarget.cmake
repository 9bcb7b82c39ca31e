# Warnings as errors on our own code only (third-party headers come in as SYSTEM).
function(rtable_compile_options target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror)
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
