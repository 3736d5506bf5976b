"""The test helpers stand for what they replace: a script run in the test's process shows what a new
interpreter running it shows."""
import os
import subprocess
import sys

import pytest
from helpers import run_script

SCRIPT = '''
import os, sys, warnings
print('argv', sys.argv[1:], 'cwd', os.path.basename(os.getcwd()), 'env', os.environ.get('PROBE'))
print('first on the path:', os.path.basename(sys.path[0]))
warnings.warn('a warning each run')
kind = sys.argv[1]
if kind == 'message':
    sys.exit('error: one line that names the fix')
if kind == 'code':
    sys.exit(3)
if kind == 'raise':
    raise ValueError('not caught')
'''


@pytest.mark.parametrize('kind', ['ends', 'message', 'code', 'raise'])
def test_a_script_run_in_process_shows_what_a_new_interpreter_shows(tmp_path, kind):
    folder = tmp_path / 'scripts'
    folder.mkdir()
    script = folder / 'probe.py'
    script.write_text(SCRIPT)
    env = dict(os.environ, PROBE='set')
    fresh = subprocess.run([sys.executable, str(script), kind], cwd=tmp_path, env=env,
                           capture_output=True, text=True)
    for _ in range(2):  # the warning is shown again on a second run in the same process
        here = run_script(str(script), kind, cwd=str(tmp_path), env=env)
        assert here.returncode == fresh.returncode
        assert here.stdout == fresh.stdout
        assert here.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1]
        assert 'UserWarning: a warning each run' in here.stderr
        assert ('Traceback' in here.stderr) == ('Traceback' in fresh.stderr) == (kind == 'raise')
    assert 'PROBE' not in os.environ or os.environ['PROBE'] != 'set', 'the environment is restored'
