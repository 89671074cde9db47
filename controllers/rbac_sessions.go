package controllers

// What the controller needs for sessions (issue 15): it times sessions by
// watching them, deletes lapsed ones, keeps status.locks, and frees the locks
// of pods that are gone (a metadata-only watch of Pods).
//
// +kubebuilder:rbac:groups=locks.kubelock.io,resources=locksessions,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=locks.kubelock.io,resources=locksessions/status,verbs=update;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
