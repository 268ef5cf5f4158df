package dbagent

// Judge is judge, for the tests.
var Judge = judge
