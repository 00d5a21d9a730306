import subprocess
import sys


def test_import_ficco_loads_no_triton_torch_or_sklearn():
    code = (
        "import sys, ficco; ficco.Problem(pattern='ag_gemm', m=8, n=8, k=8, world=2);"
        "print(sorted(m for m in ('torch', 'triton', 'sklearn') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
