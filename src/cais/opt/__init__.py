"""CAIS compiler/runtime passes over the layer's dataflow graph
(``cais.workload.dataflow``): what the paper's graph-level optimizer (§III-C)
derives before the kernels run. A pass reads the graph and the kernels' tile shapes
and returns plain data a scheme consumes; passes never import ``cais.schemes``.

* ``tb_dependencies``: the TB-level dependencies of a fused sub-layer
  (GEMM-RS -> LN -> AG-GEMM): which GEMM1 tile rows feed each LN row block, and
  which LN row blocks each GEMM2 row tile reads.
* ``fusion``: deep fusion of a sub-layer into one pipeline of three kernels, and
  the asymmetric SM split between its GEMM-RS and its LN + AG-GEMM.
"""
