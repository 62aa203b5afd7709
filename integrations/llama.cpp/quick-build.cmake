# CI's quicker build of llama.cpp (scripts/llama-cpp.sh with LLAMA_CPP_QUICK=1),
# included after each project() of llama.cpp through CMAKE_PROJECT_INCLUDE, with
# CMAKE_UNITY_BUILD on. At the end of the configuration it takes out of the
# unity batches the files that do not build in one (common/json.cpp's
# specialisations, mtmd's helpers, which refuse mtmd's internal headers), and
# builds the C++ front ends (common, the server, mtmd, the tools, the HTTP
# library) at -O1; ggml and libllama keep llama.cpp's own flags (-O3), so the
# kernels the checks run are optimised as stock's (in unity batches too).
include_guard(GLOBAL)
if(CMAKE_VERSION VERSION_LESS 3.19)
  message(FATAL_ERROR "quick-build.cmake needs CMake 3.19 (cmake_language(DEFER)); build without LLAMA_CPP_QUICK")
endif()
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL _fastgen_quick_build)
function(_fastgen_quick_build)
  if(TARGET llama-common)
    set_source_files_properties("${CMAKE_SOURCE_DIR}/common/json.cpp" TARGET_DIRECTORY llama-common
      PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  endif()
  if(TARGET mtmd)
    set_source_files_properties("${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper.cpp"
      "${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper-gen.cpp" TARGET_DIRECTORY mtmd
      PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  endif()
  foreach(t llama-common server-context llama-server-impl llama-server cpp-httplib mtmd llama-bench-impl
      llama-bench llama-perplexity-impl llama-perplexity llama-cli-impl llama-cli)
    if(TARGET ${t})
      set_property(TARGET ${t} APPEND PROPERTY COMPILE_OPTIONS -O1)
    endif()
  endforeach()
endfunction()
