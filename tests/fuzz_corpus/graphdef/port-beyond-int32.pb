
.
aPlaceholder*
shape:*
dtype0
 
bRelua:2147483648*
T0