# kdn_target_defaults(<target>): warnings and visibility every kdn target shares.
function(kdn_target_defaults tgt)
  target_compile_options(${tgt} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-missing-field-initializers>)
  if(KDN_THREAD_SAFETY AND CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    target_compile_options(${tgt} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wthread-safety -Werror=thread-safety>)
  endif()
endfunction()

# kdn_add_test(<name> SOURCES ... LIBS ...): a GoogleTest binary registered with ctest.
function(kdn_add_test name)
  # SERIAL: ctest runs its tests alone (timed against a bar, or heavy on memory).
  cmake_parse_arguments(T "SERIAL" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main Threads::Threads)
  kdn_target_defaults(${name})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60
    PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}" RUN_SERIAL ${T_SERIAL})
endfunction()
