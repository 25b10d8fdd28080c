// Package stacktest is test support for the stack's packages: a fake
// incusd of a three-member cluster with the stack's bridge and its address
// slices (ClusterFake), and instances and profiles as box makes them. It
// imports no package of the stack but its data (stack/model) and the Incus
// client, so the stack's own tests can use it.
package stacktest
