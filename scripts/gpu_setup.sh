# Source this on a CUDA machine that has torch, triton and pytest but no network: it installs the
# eight fireclay packages (and wheels carried in .whl/, e.g. bytecode) into /tmp/site.
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site \
    .whl/*.whl ./packages/fireclay-ir ./packages/fireclay-shapes ./packages/fireclay-capture \
    ./packages/fireclay-autograd ./packages/fireclay-loops ./packages/fireclay-cpp \
    ./packages/fireclay-triton ./packages/fireclay || return 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
