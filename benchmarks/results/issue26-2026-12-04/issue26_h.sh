export PYTHONPATH=.; timeout 200 python benchmarks/device/host_path_profile.py > $OUT/host_profile.txt 2>&1; echo rc=$?; head -4 $OUT/host_profile.txt
