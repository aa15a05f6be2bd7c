"""The single-device engine: the plan, the threshold screen, the candidate stores and the exact finish.

Its parts, lowest first (each imports only parts above it in this list; ``tests/test_layering.py``
states and checks the order):

================ ===================================================================
``stages``       counters of the pipeline's steps, recorded into each run's report
``kernels/``     the kernel backend: what runs on a device (``runs``, from its
                 ``DeviceCapabilities``) and every Triton / CUDA C launcher with its
                 torch reference; imported as the package
``exact``        exact values of pairs (float64), the finish's evaluations
``screen``       the screen of one block: products, bounds, survivors
``duplicates``   folding identical rows into groups, and unfolding the answers
``thresholds``   seeds of each row's threshold τ from a sample
``plan``         the planner: one plan from the input's description, the options, the
                 device's capabilities and the budgets
``checkpoint``   a run's progress on disk, to resume
``store/``       the candidate stores (τ, survivors, the exact finish) and where they live
``common``       the prepared corpus, devices, out-of-memory recovery, reports
``search/``      the searches: k nearest (the block pipeline, the direct path of small
                 calls), and radius queries
``graph/``       the graph: by symmetric blocks, by rows (a search), the blocks' frames
================ ===================================================================
"""
