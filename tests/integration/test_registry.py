"""Every integration test class runs under ctest: tests/CMakeLists.txt names each class of
tests/integration/test_*.py (idem_integration's suites, or an add_test that runs
`python3 -m unittest MODULE.CLASS`). A class left out is never run by the README's test
command, and its failures would go unseen (TestTokensOnOneConnection was, until this test).

    python3 -m unittest -v test_registry
"""
import glob
import os
import re
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CMAKE = os.path.join(HERE, "..", "CMakeLists.txt")


def registered(text):
    """(module, class) pairs ctest runs, from the text of tests/CMakeLists.txt."""
    out = set()
    for m in re.finditer(r"idem_integration\((\w+)\s+\"(\w*)\"\s+\"\w*\"\s+([^)]*)\)", text):
        module, prefix, rest = m.groups()
        for word in rest.split():
            if word == "ENV":
                break
            out.add((module, prefix + word))
    for m in re.finditer(r"-m unittest(?: -v)? (test_\w+)\.(Test\w+)", text):
        out.add(m.groups())
    return out


def defined():
    """(module, class) pairs of the test classes in tests/integration/test_*.py."""
    out = set()
    for path in glob.glob(os.path.join(HERE, "test_*.py")):
        module = os.path.basename(path)[:-3]
        with open(path) as f:
            for name in re.findall(r"^class (Test\w+)\(", f.read(), re.M):
                out.add((module, name))
    return out


class TestRegistry(unittest.TestCase):
    def test_every_class_runs_under_ctest(self):
        with open(CMAKE) as f:
            runs = registered(f.read())
        missing = sorted("%s.%s" % p for p in defined() - runs)
        self.assertEqual(missing, [], "test classes ctest never runs: add them to "
                         "tests/CMakeLists.txt")
        stale = sorted("%s.%s" % p for p in runs - defined())
        self.assertEqual(stale, [], "tests/CMakeLists.txt names classes that do not exist")

    def test_the_parser_sees_both_forms(self):
        text = ('idem_integration(test_x "TestX" "x_" One Two\n  ENV "A=1")\n'
                'add_test(NAME integration.y COMMAND ${PYTHON3} -m unittest -v test_y.TestY)\n')
        self.assertEqual(registered(text),
                         {("test_x", "TestXOne"), ("test_x", "TestXTwo"), ("test_y", "TestY")})


if __name__ == "__main__":
    unittest.main()
