"""Examples of robot_sdf: the MPC demo (mpc_demo, demo), its robot, planner and figures.

These modules may use ROS (the service path); the in-process path needs only the core.
"""
