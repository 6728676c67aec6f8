"""common.forking: a child forked inside ``inherited_objects_frozen`` never collects what its parent had."""

import gc
import os

from common.forking import inherited_objects_frozen


def test_the_child_keeps_the_parents_objects_frozen_and_the_parent_does_not():
    assert gc.get_freeze_count() == 0
    read, write = os.pipe()
    with inherited_objects_frozen():
        pid = os.fork()
        if pid == 0:  # the child: everything it inherited is in the permanent generation
            os.close(read)
            os.write(write, str(gc.get_freeze_count()).encode())
            os._exit(0)
    os.close(write)
    frozen_in_child = int(os.read(read, 64) or b"0")
    os.close(read)
    assert os.waitpid(pid, 0)[1] == 0
    assert frozen_in_child > 10_000  # the test runner's objects, torch's among them
    assert gc.get_freeze_count() == 0  # the parent collects as before
