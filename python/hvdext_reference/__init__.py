"""NumPy references for horovod-ext: the definition of every compressor's math, and the test oracles.

Each module holds one algorithm. The C++ kernels in ``cpp/`` must produce the same bits as these functions
for the same inputs and random keys; the tests compare them over many sizes.
"""
