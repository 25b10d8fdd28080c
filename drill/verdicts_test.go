package drill

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestPlaceControlled(t *testing.T) {
	res := func(from Place, e Expectation, v Verdict) Result {
		return Result{Action: Action{From: from, Expect: e, Target: "x"}, Verdict: v}
	}
	blocked := res(PlaceT, ExpectBlocked, Pass)
	noName := res(PlaceT, ExpectNoName, Pass)
	okCtl := res(PlaceT, ExpectReach, Pass)
	badCtl := res(PlaceT, ExpectResolve, Fail)
	fromA := res(PlaceA, ExpectBlocked, Pass)

	got := placeControlled([]Result{okCtl, blocked, noName}, PlaceT)
	assert.Equal(t, Pass, got[1].Verdict, "controls passed: the block stands")
	assert.Equal(t, Pass, got[2].Verdict)

	got = placeControlled([]Result{okCtl, badCtl, blocked, noName, fromA}, PlaceT)
	assert.Equal(t, Inconclusive, got[2].Verdict, "box-t reached nothing: its block proves nothing")
	assert.Equal(t, Inconclusive, got[3].Verdict)
	assert.Equal(t, Fail, got[1].Verdict, "the failed control stays a failure")
	assert.Equal(t, Pass, got[4].Verdict, "box-a's results are not box-t's to judge")

	got = placeControlled([]Result{blocked}, PlaceT)
	assert.Equal(t, Inconclusive, got[0].Verdict, "no control at all is no evidence")
}
