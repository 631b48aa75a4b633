"""builtin:digits is read from scikit-learn's data file without importing scikit-learn."""
import os
import subprocess
import sys

import numpy as np


def test_the_digits_equal_scikit_learns_and_are_read_without_importing_it():
    code = ("import sys; from evenflow.data.digits import load_digits; images, labels = load_digits(); "
            "print(images.shape, labels.shape, labels.dtype, 'sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["(1797,", "8,", "8)", "(1797,)", "int64", "False"]
    from sklearn.datasets import load_digits as sklearn_digits

    from evenflow.data.digits import load_digits

    images, labels = load_digits()
    want = sklearn_digits()
    np.testing.assert_array_equal(images, want.images)
    np.testing.assert_array_equal(labels, want.target)


def test_the_cli_imports_tensorflow_without_keras_extras_and_they_stay_importable():
    # The CLI hides scikit-learn, matplotlib, pandas and SciPy while TensorFlow is imported (Keras then
    # leaves out the features that need them, about a third of the import time); the library alone
    # leaves Keras as it is. Imported afterwards, each package works as usual.
    code = ("import sys; from evenflow.tf import _lazy; {skip}_lazy.tf(); "
            "print(*[m in sys.modules for m in _lazy.KERAS_EXTRAS]); "
            "import sklearn, matplotlib.pyplot, pandas, scipy.sparse; "
            "print(sklearn.__name__, matplotlib.pyplot.__name__, pandas.__name__, scipy.sparse.__name__)")
    for skip, loaded in (("_lazy.skip_keras_extras(); ", "False"), ("", "True")):
        out = subprocess.run([sys.executable, "-c", code.format(skip=skip)], capture_output=True, text=True,
                             check=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}).stdout
        assert out.split() == [loaded] * 4 + ["sklearn", "matplotlib.pyplot", "pandas", "scipy.sparse"]
