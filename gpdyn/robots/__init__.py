"""Robots: one module per robot with everything that is specific to it.

``walker`` (MuJoCo Walker2d), ``arm`` (any n-DOF arm built from an MJCF file) and
``kuka`` (the KUKA LBR iiwa 14, the default arm); MJCF files ship in ``assets/``.
"""
