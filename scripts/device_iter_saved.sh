set -u
export OUT=${OUT:-/tmp/out}
FULL=1 bash scripts/device_trimul_iter.sh .devbin
TPF_LIBRARY=$PWD/.devbin/libturbopairformer_c.so PYTHONPATH=python timeout 300 python -m pytest -q -x tests/python/test_trimul.py tests/python/test_modules.py > $OUT/pytest.txt 2>&1; tail -3 $OUT/pytest.txt
