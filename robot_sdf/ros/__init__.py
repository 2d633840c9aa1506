"""ROS 2 layer of robot_sdf: the ``sdf_server`` node and message conversions.

Importing this package does not import rclpy; the submodules do:

- ``robot_sdf.ros.parameters``: the node's parameter table and its validation.
- ``robot_sdf.ros.conversions``: numpy <-> message conversions, publisher helpers
  (``make_mesh_obstacle``, ``make_obstacle_pose``) and the distance-slice point cloud.
- ``robot_sdf.ros.markers``: rviz markers of meshes and request spheres.
- ``robot_sdf.ros.frames``: poses of incoming messages into world_frame (tf2 or static transforms).
- ``robot_sdf.ros.health``: the node's diagnostics: recent problems -> level and message,
  request statistics, the /diagnostics status.
- ``robot_sdf.ros.sdf_server``: the node (console script ``sdf_server``): parameters, life
  cycle, services and publishers.
- ``robot_sdf.ros.lifecycle``: its managed variant (console script ``sdf_server_managed``).
- ``robot_sdf.ros.node_process``: the node's process: ``run_node`` (signals, the main executor,
  a clean shutdown), the companion nodes' executor threads, process-wide tuning.
- ``robot_sdf.ros.world_setup``: what the node loads at configure time: scene file, saved
  state, kernel warm-up.
- ``robot_sdf.ros.world_updates``: the node's update ingestion: mesh and pose subscriptions,
  held updates, stamps, rejections; applying a MeshObstacle ADD (size limits, refit or rebuild).
- ``robot_sdf.ros.update_queue``: the lossless, per-id ordered queue of mesh updates (no ROS).
- ``robot_sdf.ros.client``: the MPC-side client of the node's services.
- ``robot_sdf.ros.scene_publisher``: ``ScenePublisher``, a producer that re-sends its scene to
  every node that (re)appears.
- ``robot_sdf.ros.server_process``: the node as a subprocess (demos, tests) and ROS domain id
  reservation (no ROS).
"""
