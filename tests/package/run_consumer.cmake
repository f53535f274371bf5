# Builds and runs tests/package/consumer against kiln; invoked by CTest (see CMakeLists.txt here).
#   cmake -DMODE=install|subdir -DWORK_DIR=... -DKILN_SOURCE_DIR=... -DKILN_BINARY_DIR=... -DCONSUMER_DIR=...
#         -DCXX=... -DGENERATOR=... -DBUILD_TYPE=... -P run_consumer.cmake
cmake_minimum_required(VERSION 3.25)
foreach(v MODE WORK_DIR KILN_SOURCE_DIR KILN_BINARY_DIR CONSUMER_DIR CXX GENERATOR BUILD_TYPE)
  if(NOT DEFINED ${v} OR "${${v}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake: -D${v}=... is required")
  endif()
endforeach()

function(run_step what)
  message(STATUS "package test (${MODE}): ${what}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "package test (${MODE}): ${what} failed (exit ${rc}): ${ARGN}")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(configure_args -S "${CONSUMER_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
    "-DCMAKE_CXX_COMPILER=${CXX}" "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}"
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)

if(MODE STREQUAL "install")
  set(prefix "${WORK_DIR}/prefix")
  run_step("install kiln into ${prefix}" "${CMAKE_COMMAND}" --install "${KILN_BINARY_DIR}" --prefix "${prefix}")
  file(GLOB_RECURSE config_file "${prefix}/*/kilnConfig.cmake")
  if(NOT EXISTS "${prefix}/include/kiln/kiln.hpp" OR NOT config_file)
    message(FATAL_ERROR "package test: the install tree lacks include/kiln/kiln.hpp or kilnConfig.cmake")
  endif()
  # The installed package's kiln_add_kernels() (its implementation files beside the config file).
  list(APPEND configure_args -DKILN_CONSUMER_MODE=package "-DCMAKE_PREFIX_PATH=${prefix}"
       "-DKILN_EXPECT_PREFIX=${prefix}" -DKILN_CONSUMER_KERNELS=library)
elseif(MODE STREQUAL "subdir")
  list(APPEND configure_args -DKILN_CONSUMER_MODE=subdir "-DKILN_SOURCE_DIR=${KILN_SOURCE_DIR}")
else()
  message(FATAL_ERROR "run_consumer.cmake: MODE must be install or subdir, not '${MODE}'")
endif()

run_step("configure the consumer" "${CMAKE_COMMAND}" ${configure_args})
run_step("build the consumer" "${CMAKE_COMMAND}" --build "${WORK_DIR}/build" -j2)
execute_process(COMMAND "${WORK_DIR}/build/kiln_consumer" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "package test (${MODE}): the consumer exited with ${rc}")
endif()
