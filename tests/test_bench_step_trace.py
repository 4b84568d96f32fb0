"""``bench.step_trace``'s tracer: the project's files a call runs, in first-run order, and
nothing outside the project (torch, numpy, the tests themselves)."""

import numpy as np
import torch

from odin_ns.bench.step_trace import project_file, trace_call
from odin_ns.runtime.layout import EVERY_RANK, ShardLayout
from odin_ns.runtime.uploads import upload


def test_trace_lists_the_projects_files_in_the_order_their_code_first_ran():
    def call():
        layout = ShardLayout(np.full(4, EVERY_RANK), 0, np.empty(0, dtype=np.int64))
        torch.zeros(1)
        upload(torch.tensor([1, 2]), torch.device("cpu"))
        return layout.local(np.array([1, 2]))

    result, files = trace_call(call)
    assert result.tolist() == [1, 2]
    assert files == [
        ("odin_ns/runtime/layout.py", "__post_init__"),
        ("odin_ns/runtime/uploads.py", "upload"),
    ]
    assert project_file(torch.__file__) is None and project_file(__file__) is None
