"""Robot episodes stored as MP4 camera streams (LeRobot dataset v3 layout)."""
